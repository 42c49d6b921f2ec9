"""`export hf`: a bf16/fp16 serving directory that transformers loads with the right dtype."""

from __future__ import annotations

import json

import pytest
import torch
from export_testing import make_checkpoint

from portachat.export import ExportError, export_hf

TEXT = "ROMEO: But soft, what light through yonder window breaks? 1234"


@pytest.mark.parametrize("dtype, torch_dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_export_hf_loads_in_transformers_in_its_dtype(tmp_path, checkpoint, small_tokenizer, dtype, torch_dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, model = checkpoint
    result = export_hf(checkpoint[0], tmp_path / "serve", dtype=dtype)
    out = result.path
    names = sorted(p.name for p in out.iterdir())
    assert "trainer_state" not in names and "model.safetensors" in names and "generation_config.json" in names
    config = json.loads((out / "config.json").read_text())
    assert config["torch_dtype"] == config["dtype"] == str(torch_dtype).removeprefix("torch.")
    assert result.weight_bytes == sum(p.numel() for p in model.parameters()) * 2

    hf = AutoModelForCausalLM.from_pretrained(out, dtype="auto").eval()
    assert hf.dtype == torch_dtype
    ids = torch.tensor([small_tokenizer.encode(TEXT)])
    assert AutoTokenizer.from_pretrained(out)(TEXT, add_special_tokens=False)["input_ids"] == ids[0].tolist()
    with torch.no_grad():
        ours = model.to(torch_dtype)(ids)
        theirs = hf(ids).logits.float()
    assert (ours - theirs).abs().max() < 0.05 * ours.abs().max()


def test_stage_directories_and_run_names_resolve_to_latest(tmp_path, small_tokenizer, monkeypatch):
    from portachat.storage.runs import set_latest

    home = tmp_path / "home"
    monkeypatch.setenv("PORTACHAT_HOME", str(home))
    stage = home / "runs" / "myrun" / "sft"
    stage.mkdir(parents=True)
    step, _ = make_checkpoint(stage / "step_00000007", small_tokenizer)
    set_latest(stage, step)
    assert export_hf(stage, tmp_path / "a").path.is_dir()
    assert export_hf("myrun/sft", tmp_path / "b").path.is_dir()


def test_our_loader_reads_the_export_back(tmp_path, checkpoint):
    from portachat.model.load import load_for_inference

    out = export_hf(checkpoint[0], tmp_path / "serve").path
    loaded = load_for_inference(out, device="cpu", dtype="bf16")
    assert loaded.source == "portachat" and loaded.dtype == torch.bfloat16


def test_options_outside_the_hf_mapping_are_refused_with_the_reason(tmp_path, small_tokenizer):
    path, _ = make_checkpoint(tmp_path / "odd", small_tokenizer, qk_norm=False)  # qwen3 without QK-norm
    with pytest.raises(ExportError, match="cannot be exported: qk_norm=False"):
        export_hf(path, tmp_path / "serve")
    assert not (tmp_path / "serve").exists()


def test_bad_inputs_say_what_to_do(tmp_path, checkpoint):
    with pytest.raises(ExportError, match="valid values: bf16, fp16"):
        export_hf(checkpoint[0], tmp_path / "x", dtype="int8")
    with pytest.raises(ExportError, match="no model at"):
        export_hf(tmp_path / "missing", tmp_path / "x")
    (tmp_path / "taken").mkdir()
    with pytest.raises(ExportError, match="already exists"):
        export_hf(checkpoint[0], tmp_path / "taken")


def test_the_export_keeps_the_checkpoints_generation_defaults(tmp_path, small_tokenizer):
    from portachat.model.load import load_for_inference

    sampling = {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.05}
    path, _ = make_checkpoint(tmp_path / "ckpt", small_tokenizer, generation_defaults=sampling)
    ours = json.loads((path / "generation_config.json").read_text())
    assert {k: ours[k] for k in sampling} == sampling
    out = export_hf(path, tmp_path / "serve").path
    assert json.loads((out / "generation_config.json").read_text()) == ours
    assert load_for_inference(out, device="cpu", dtype="bf16").generation == load_for_inference(
        path, device="cpu", dtype="fp32").generation
    meta = json.loads((out / "portachat.json").read_text())
    assert (meta["exported_from"], meta["stage"], meta["step"]) == (str(path), "sft", 7)
    assert meta["tokenizer_fingerprint"] == small_tokenizer.fingerprint() and "data_position" not in meta
