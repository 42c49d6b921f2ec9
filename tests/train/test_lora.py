"""LoRA fine-tuning through peft on a tiny random Llama made with transformers: only the adapter trains,
the adapter is PEFT's format (transformers + peft load it, same logits), --merge gives the same model."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import torch

from portachat.checkpoint import CheckpointError
from portachat.device import get_device
from portachat.model.load import load_for_inference
from portachat.train.finetune import FinetuneOptions, run_finetune
from portachat.train.lora import LoraOptions, load_adapter
from portachat.train.trainer import TrainConfig
from tests.model.hf_families import make_hf_dir

TARGETS = ["q_proj", "v_proj"]


def write_conversations(path: Path, n: int = 16) -> Path:
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            reply = f"the quick brown fox jumps over {i % 4} lazy dog"
            f.write(json.dumps({"messages": [{"role": "user", "content": f"hello, how are you {i}?"},
                                             {"role": "assistant", "content": reply}]}) + "\n")
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    base = root / "base"
    make_hf_dir(base, "llama", seed=1)
    data = write_conversations(root / "chat.jsonl")
    opts = FinetuneOptions(
        init=str(base), data=[str(data)], num_iterations=8, max_seq_len=48, eval_examples=0, lr=1e-2,
        lora=LoraOptions(rank=4, alpha=8, targets=TARGETS), merge=True,
        train=TrainConfig(run="lora", runs_root=str(root / "runs"), device_batch_size=4, eval_every=8, log_every=1,
                          warmdown_ratio=0.0),
    )
    result = run_finetune(opts, dev=get_device("cpu", dtype="fp32", compile=False), print_fn=lambda _m: None)
    return base, result.final_checkpoint, result.final_checkpoint.parent


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids)


IDS = torch.tensor([[1, 5, 9, 40, 77, 120, 3, 250, 17, 2], [1, 300, 64, 12, 8, 99, 150, 6, 7, 30]])


def test_validation_loss_falls(trained):
    _base, _adapter, stage = trained
    records = [json.loads(line) for line in (stage / "log.jsonl").read_text().splitlines()]
    val = {r["step"]: r["eval/val_loss"] for r in records if "eval/val_loss" in r}
    assert val[8] < val[0] - 0.5, val


def test_only_the_adapter_is_checkpointed_in_peft_format(trained):
    base, adapter, _stage = trained
    names = {p.name for p in adapter.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert "model.safetensors" not in names
    from safetensors.torch import load_file

    keys = load_file(str(adapter / "adapter_model.safetensors"))
    assert keys and all(k.startswith("base_model.model.model.layers.") for k in keys)
    assert {k.split(".")[-2] for k in keys} == {"lora_A", "lora_B"}
    assert {k.split(".")[-3] for k in keys} == set(TARGETS)
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["base_model_name_or_path"] == str(base)


def test_only_adapter_targets_change_and_by_at_most_rank_r(trained):
    base, _adapter, stage = trained
    before = load_for_inference(base, device="cpu", dtype=torch.float32).model.state_dict()
    after = load_for_inference(stage / "merged", device="cpu", dtype=torch.float32).model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.split(".")[-2] in TARGETS for k in changed), changed
    for k in changed:
        assert torch.linalg.matrix_rank(after[k] - before[k], atol=1e-5) <= 4


def test_transformers_and_peft_load_the_adapter_with_our_logits(trained):
    import transformers
    from peft import PeftModel

    base, adapter, _stage = trained
    ours = load_for_inference(base, device="cpu", dtype=torch.float32, lora=adapter)
    assert "LoRA" in ours.description
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(hf, str(adapter)).eval()
    with torch.no_grad():
        theirs = peft_model(IDS).logits
    plain = logits(load_for_inference(base, device="cpu", dtype=torch.float32).model, IDS)
    assert (theirs - plain).abs().max() > 1e-2  # the adapter does something
    torch.testing.assert_close(logits(ours.model, IDS), theirs, atol=1e-4, rtol=0)


def test_merged_checkpoint_gives_the_adapters_logits(trained):
    base, adapter, stage = trained
    with_adapter = load_for_inference(base, device="cpu", dtype=torch.float32, lora=adapter)
    merged = load_for_inference(stage / "merged", device="cpu", dtype=torch.float32)
    assert json.loads((stage / "merged" / "config.json").read_text())["model_type"] == "llama"
    torch.testing.assert_close(logits(merged.model, IDS), logits(with_adapter.model, IDS), atol=1e-4, rtol=0)


def test_a_full_disk_while_merging_says_so_and_keeps_the_previous_merged_model(trained, monkeypatch):
    from types import SimpleNamespace

    import portachat.train.finetune as finetune

    _base, _adapter, stage = trained
    before = {p.name: p.read_bytes() for p in (stage / "merged").iterdir()}

    def fill_the_disk(directory, *_args, **_kwargs):
        (directory / "model.safetensors").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(finetune, "merge_lora", lambda model: model)
    monkeypatch.setattr(finetune, "save_model_files", fill_the_disk)
    with pytest.raises(CheckpointError, match="disk full while writing checkpoint"):
        finetune.write_merged(stage, None, SimpleNamespace(tokenizer=None, generation={}), {})
    assert {p.name: p.read_bytes() for p in (stage / "merged").iterdir()} == before
    assert not list(stage.glob(".tmp-merged*"))


def test_an_adapter_for_another_model_is_refused(trained, tmp_path):
    _base, adapter, _stage = trained
    other = tmp_path / "other"
    make_hf_dir(other, "llama", hidden_size=32, intermediate_size=48)
    model = load_for_inference(other, device="cpu", dtype=torch.float32).model
    with pytest.raises(CheckpointError, match="shape"):
        load_adapter(model, adapter)
    with pytest.raises(CheckpointError, match="not a LoRA adapter"):
        load_adapter(model, tmp_path)


def test_the_engine_serves_base_plus_adapter(trained):
    """`serve --model BASE --lora ADAPTER`: the served engine answers as the merged checkpoint does."""
    from portachat.engine import SamplingParams
    from portachat.engine.loading import LoadOptions, load_served_model

    base, adapter, stage = trained
    prompt = [1, 5, 9, 40, 77, 120]
    params = SamplingParams(max_tokens=8, temperature=0.0, seed=0)
    replies = []
    for model, lora in ((str(base), str(adapter)), (str(stage / "merged"), None), (str(base), None)):
        served = load_served_model(LoadOptions(model=model, lora=lora, device="cpu", dtype="fp32", compile=False,
                                               max_num_seqs=1, max_model_len=64))
        replies.append(list(served.engine.generate([prompt], [params])[0].token_ids))
    with_adapter, merged, plain = replies
    assert with_adapter == merged and len(with_adapter) > 0
    assert with_adapter != plain


def test_a_lora_run_loads_by_its_checkpoint_alone(trained):
    """The adapter names its base (base_model_name_or_path): `--model <run>/sft` serves base + adapter."""
    base, adapter, stage = trained
    alone = load_for_inference(stage, device="cpu", dtype=torch.float32)
    explicit = load_for_inference(base, device="cpu", dtype=torch.float32, lora=adapter)
    torch.testing.assert_close(logits(alone.model, IDS), logits(explicit.model, IDS), atol=0, rtol=0)


@pytest.mark.slow
def test_cli_lora_sft_with_merge(tmp_path):
    from tests.e2e.helpers import run_cli

    base = tmp_path / "base"
    make_hf_dir(base, "llama", seed=5)
    data = write_conversations(tmp_path / "chat.jsonl")
    home = tmp_path / "home"
    proc = run_cli(["train", "sft", "--init", str(base), "--data", str(data), "--lora-rank", "4", "--merge",
                    "--device", "cpu", "--dtype", "fp32", "--compile", "0", "--max-seq-len", "32",
                    "--device-batch-size", "2", "--num-iterations", "2", "--eval-examples", "0"], home)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    stage = home / "runs" / "default" / "sft"
    assert (stage / "step_000002" / "adapter_model.safetensors").is_file()
    assert (stage / "merged" / "model.safetensors").is_file()
    assert "LoRA r=4" in proc.stdout and "merged model" in proc.stdout
    bad = run_cli(["train", "sft", "--init", str(base), "--data", str(data), "--merge", "--run-name", "x"], home)
    assert bad.returncode != 0 and "--lora-rank" in bad.stderr
