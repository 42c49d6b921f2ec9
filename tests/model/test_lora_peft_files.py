"""PEFT LoRA adapters read without peft: scaling as peft computes it (alpha / r, rsLoRA, alpha_pattern),
merged weights equal to peft's own forward, and clear refusals of what cannot be served."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import save_file

from portachat.model import GPT, GPTConfig
from portachat.model.lora import find_adapter_dir, load_lora, merge_into
from portachat.storage.atomic import CheckpointError
from portachat.storage.runs import set_latest
from portachat.train.lora import adapter_state_dict
from tests.lora_files import write_random_adapter


def tiny() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=96, n_layer=2, n_embd=32, n_head=4, n_kv_head=2, head_dim=8,
                         intermediate_size=64, max_seq_len=32)).eval()


@pytest.mark.parametrize("rslora", [False, True])
def test_merged_adapter_equals_peft_forward(tmp_path, rslora):
    peft = pytest.importorskip("peft")
    base = tiny()
    with_peft = copy.deepcopy(base)
    config = peft.LoraConfig(r=4, lora_alpha=12, target_modules=["q_proj", "v_proj", "down_proj"], use_rslora=rslora,
                             alpha_pattern={"down_proj": 3.0}, bias="none", task_type="CAUSAL_LM")
    peft.inject_adapter_in_model(config, with_peft, adapter_name="default")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in with_peft.named_parameters():
            if ".lora_" in name:  # peft starts B at zero: random weights so the adapter matters
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    save_file(adapter_state_dict(with_peft), str(tmp_path / "adapter_model.safetensors"))
    raw = {k: sorted(v) if isinstance(v, set) else v for k, v in config.to_dict().items()}
    (tmp_path / "adapter_config.json").write_text(json.dumps(raw), encoding="utf-8")

    lora = load_lora(tmp_path)
    assert sorted(n.rsplit(".", 1)[-1] for n in lora.modules) == ["down_proj"] * 2 + ["q_proj"] * 2 + ["v_proj"] * 2
    ids = torch.randint(0, 96, (2, 12), generator=g)
    with torch.no_grad():
        expected, plain = with_peft(ids), base(ids)
        merged = merge_into(copy.deepcopy(base), lora)(ids)
    assert not torch.allclose(expected, plain, atol=1e-3)  # the adapter changes the output
    torch.testing.assert_close(merged, expected, atol=1e-5, rtol=1e-5)


def test_damaged_or_unsupported_adapters_are_refused(tmp_path):
    model = tiny()
    path = write_random_adapter(tmp_path / "a", model, rank=2, alpha=2, targets=("q_proj",))
    config = json.loads((path / "adapter_config.json").read_text())
    (path / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    with pytest.raises(CheckpointError, match="no DoRA"):
        load_lora(path)

    half = write_random_adapter(tmp_path / "b", model, rank=2, alpha=2, targets=("q_proj",))
    from safetensors.torch import load_file

    tensors = {k: v for k, v in load_file(str(half / "adapter_model.safetensors")).items() if "lora_B" not in k}
    save_file(tensors, str(half / "adapter_model.safetensors"))
    with pytest.raises(CheckpointError, match="without its partner"):
        load_lora(half)

    wider = GPT(GPTConfig(vocab_size=96, n_layer=2, n_embd=48, n_head=4, n_kv_head=2, head_dim=8,
                          intermediate_size=64, max_seq_len=32))
    other = write_random_adapter(tmp_path / "c", wider, rank=2, alpha=2)
    with pytest.raises(CheckpointError, match="another base model"):
        merge_into(model, load_lora(other))
    with pytest.raises(CheckpointError, match="is not a LoRA adapter"):
        load_lora(tmp_path)


def test_find_adapter_dir_follows_the_model_resolver(tmp_path, monkeypatch):
    """An adapter directory, a LoRA run's stage or run directory, its `latest` file or RUN/STAGE name the
    checkpoint `latest` points to; anything without an adapter there gets the same advice."""
    home = tmp_path / "home"
    monkeypatch.setenv("PORTACHAT_HOME", str(home))
    run = home / "runs" / "tuned"
    stage = run / "sft"
    model = tiny()
    for step in ("step_00000004", "step_00000008"):
        write_random_adapter(stage / step, model, rank=2, alpha=2)
        (stage / step / "portachat.json").write_text("{}")
    set_latest(stage, stage / "step_00000004")  # `latest`, not the newest step
    latest = stage / "step_00000004"
    assert find_adapter_dir(latest) == latest
    for spec in (stage, stage / "latest", run, "tuned/sft", str(stage)):
        assert find_adapter_dir(spec) == latest

    full = tmp_path / "full" / "step_00000001"  # a stage whose latest checkpoint is a whole model
    full.mkdir(parents=True)
    (full / "portachat.json").write_text("{}")
    (full / "config.json").write_text("{}")
    set_latest(full.parent, full)
    (tmp_path / "notes.txt").write_text("x")
    for spec in (tmp_path / "missing", tmp_path / "full", tmp_path / "notes.txt", tmp_path / "home"):
        with pytest.raises(CheckpointError, match=r"--lora .*: no LoRA adapter there \(adapter_config.json missing\)"):
            find_adapter_dir(spec)
