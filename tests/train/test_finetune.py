"""Full fine-tuning of existing models with our Trainer: a tiny random Qwen2 (biases) made with transformers
keeps its architecture, tokenizer and chat template; 2 processes (torchrun, gloo) match 1 process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from portachat.device import get_device
from portachat.model.load import load_for_inference
from portachat.train.finetune import FULL_LR, FinetuneOptions, run_finetune
from portachat.train.trainer import TrainConfig, TrainingError
from tests.e2e.helpers import cli_env, run_cli, step_losses
from tests.model.hf_families import make_hf_dir
from tests.train.test_lora import IDS, write_conversations


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory):
    root = tmp_path_factory.mktemp("full")
    base = root / "base"
    make_hf_dir(base, "qwen2", seed=2)
    data = write_conversations(root / "chat.jsonl")
    opts = FinetuneOptions(
        init=str(base), data=[str(data)], num_iterations=8, max_seq_len=48, eval_examples=0, lr=3e-3,
        train=TrainConfig(run="full", runs_root=str(root / "runs"), device_batch_size=4, eval_every=8, log_every=1,
                          warmdown_ratio=0.0),
    )
    result = run_finetune(opts, dev=get_device("cpu", dtype="fp32", compile=False), print_fn=lambda _m: None)
    return base, result.final_checkpoint


def test_full_finetuning_lowers_the_validation_loss(finetuned):
    _base, ckpt = finetuned
    records = [json.loads(line) for line in (ckpt.parent / "log.jsonl").read_text().splitlines()]
    val = {r["step"]: r["eval/val_loss"] for r in records if "eval/val_loss" in r}
    assert val[8] < val[0] - 0.5, val
    meta = json.loads((ckpt / "portachat.json").read_text())
    assert meta["finetune"] == "full" and meta["init_from"]


def test_result_is_the_same_architecture_with_its_own_tokenizer_and_template(finetuned):
    import transformers

    base, ckpt = finetuned
    cfg, base_cfg = (json.loads((d / "config.json").read_text()) for d in (ckpt, base))
    assert cfg["model_type"] == base_cfg["model_type"] == "qwen2"
    assert cfg["architectures"] == base_cfg["architectures"]
    base_template = load_for_inference(base, device="cpu", dtype=torch.float32).tokenizer.chat_template
    assert json.loads((ckpt / "tokenizer_config.json").read_text())["chat_template"] == base_template
    assert json.loads((ckpt / "tokenizer.json").read_text())["model"]["vocab"] == \
        json.loads((base / "tokenizer.json").read_text())["model"]["vocab"]
    ours = load_for_inference(ckpt, device="cpu", dtype=torch.float32)
    assert ours.source == "huggingface"
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(ours.model(IDS), hf(IDS).logits, atol=1e-4, rtol=0)
        before = load_for_inference(base, device="cpu", dtype=torch.float32).model(IDS)
    assert (ours.model(IDS) - before).abs().max() > 1e-2


def test_cli_routes_init_of_an_existing_model_to_finetuning(tmp_path):
    from portachat.cli import build_parser
    from portachat.commands.run.finetune_args import finetune_options, wants_finetune
    from portachat.train.chat_stage import ChatOptions

    base = tmp_path / "base"
    make_hf_dir(base, "llama")
    args = build_parser().parse_args(["train", "sft", "--init", str(base), "--lora-rank", "8"])
    assert wants_finetune(args)
    opts = finetune_options(args, ChatOptions(stage="sft", init=str(base)))
    assert opts.lora is not None and opts.lora.rank == 8 and opts.lora.alpha == 16 and opts.lr is None
    args = build_parser().parse_args(["train", "sft", "--init", str(base), "--lora-rank", "8", "--lora-targets", "qkv"])
    with pytest.raises(TrainingError, match="--lora-targets"):
        finetune_options(args, ChatOptions(stage="sft", init=str(base)))
    assert FULL_LR < 1e-4


@pytest.mark.slow
def test_torchrun_two_processes_match_one_process(tmp_path):
    base = tmp_path / "base"
    make_hf_dir(base, "llama", seed=3)
    data = write_conversations(tmp_path / "chat.jsonl")
    home = tmp_path / "home"
    common = ["train", "sft", "--init", str(base), "--data", str(data), "--device", "cpu", "--dtype", "fp32",
              "--compile", "0", "--max-seq-len", "32", "--device-batch-size", "2", "--num-iterations", "4",
              "--eval-every", "0", "--eval-examples", "0", "--lr", "1e-3", "--total-batch-size", str(2 * 32 * 2)]
    single = run_cli([*common, "--run-name", "single"], home, threads=1)
    assert single.returncode == 0, single.stdout[-2000:] + single.stderr[-3000:]
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "-m", "portachat", *common, "--run-name", "ddp"], env=cli_env(home, threads=1),
                         capture_output=True, text=True, timeout=600)
    assert ddp.returncode == 0, ddp.stdout[-3000:] + ddp.stderr[-3000:]
    assert "weights identical on all 2 ranks" in ddp.stdout
    a = step_losses(home / "runs" / "single" / "sft" / "log.jsonl")
    b = step_losses(home / "runs" / "ddp" / "sft" / "log.jsonl")
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    for step in a:
        assert b[step] == pytest.approx(a[step], abs=1e-4), (step, a[step], b[step])
    from safetensors.torch import load_file

    wa = load_file(str(home / "runs" / "single" / "sft" / "step_000004" / "model.safetensors"))
    wb = load_file(str(home / "runs" / "ddp" / "sft" / "step_000004" / "model.safetensors"))
    w0 = load_for_inference(base, device="cpu", dtype=torch.float32).model.state_dict()
    assert any(not torch.allclose(wa[k], w0[k]) for k in wa)
    for name in wa:
        assert torch.allclose(wa[name], wb[name], atol=1e-4), name


def test_full_finetuning_resumes_exactly(tmp_path):
    base = tmp_path / "base"
    make_hf_dir(base, "llama", seed=4)
    data = write_conversations(tmp_path / "chat.jsonl")
    dev = get_device("cpu", dtype="fp32", compile=False)

    def run(name: str, resume: str | None = None):
        opts = FinetuneOptions(init=str(base), data=[str(data)], num_iterations=4, max_seq_len=32, eval_examples=0,
                               lr=1e-3, resume=resume,
                               train=TrainConfig(run=name, runs_root=str(tmp_path / "runs"), device_batch_size=2,
                                                 eval_every=0, save_every=2, keep_last=0))
        return run_finetune(opts, dev=dev, print_fn=lambda _m: None).final_checkpoint

    straight = run("straight")
    resumed = run("resumed", resume=str(straight.parent / "step_000002"))
    from safetensors.torch import load_file

    a, b = (load_file(str(d / "model.safetensors")) for d in (straight, resumed))
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.parametrize("rows", ["pack", "budget"])
def test_packed_and_token_budget_finetuning_train_on_every_real_token(tmp_path, rows):
    base = tmp_path / "base"
    make_hf_dir(base, "qwen2", seed=2)
    data = write_conversations(tmp_path / "chat.jsonl")
    opts = FinetuneOptions(
        init=str(base), data=[str(data)], num_iterations=3, max_seq_len=48, eval_examples=0, lr=3e-3,
        pack=rows == "pack",
        train=TrainConfig(run=rows, runs_root=str(tmp_path / "runs"), device_batch_size=2, eval_every=0, log_every=1,
                          tokens_per_batch=96 if rows == "budget" else None),
    )
    lines: list[str] = []
    result = run_finetune(opts, dev=get_device("cpu", dtype="fp32", compile=False), print_fn=lines.append)
    assert any("blocks recompute their activations" in line for line in lines)  # a CPU's default for fine-tuning
    steps = [r for r in map(json.loads, (result.final_checkpoint.parent / "log.jsonl").read_text().splitlines())
             if "loss" in r]
    assert len(steps) == 3 and all(r["supervised_tokens"] > 0 and 0 <= r["padding"] < 1 for r in steps)
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in steps)
