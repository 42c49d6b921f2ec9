"""load_for_inference on our own checkpoints: our tokenizer and chat format, exact weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gpt_testing import randomized, tiny_config

from portachat.model import GPT, UnsupportedConfigError
from portachat.model.load import load_for_inference
from portachat.model.model_dir import save_model_files
from portachat.model.source import display_name, resolve
from portachat.storage.atomic import CheckpointError
from portachat.tokenizer import train_tokenizer
from portachat.tokenizer.chat_tokenizer import PortachatChatTokenizer


@pytest.fixture(scope="module")
def our_tokenizer():
    return train_tokenizer(["the cat sat on the mat, 12 times; hello world!"] * 30, vocab_size=300, verbose=False)


def test_our_checkpoint_loads_with_our_chat_format(tmp_path, our_tokenizer):
    directory = tmp_path / "runs" / "myrun" / "sft" / "step_5"
    directory.mkdir(parents=True)
    model = randomized(GPT(tiny_config(vocab_size=320, tie_embeddings=True)))
    save_model_files(directory, model, our_tokenizer, meta={"stage": "sft", "step": 5})
    loaded = load_for_inference(directory, device="cpu", dtype="fp32")
    assert loaded.source == "portachat" and loaded.name == "myrun-sft"
    assert isinstance(loaded.tokenizer, PortachatChatTokenizer)
    assert loaded.tokenizer.tool_tokens is not None
    assert "qwen3 family" in loaded.description and "float32" in loaded.description
    idx = torch.tensor([[1, 5, 9, 250, 7]])
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(idx), model(idx), atol=0, rtol=0)
    assert loaded.model.lm_head.weight is loaded.model.model.embed_tokens.weight

    default = load_for_inference(directory, device="cpu")  # dtype: the device layer's measured CPU choice
    assert default.dtype in (torch.float32, torch.bfloat16)
    assert next(default.model.parameters()).dtype == default.dtype


def test_a_tokenizer_from_another_checkpoint_is_refused(tmp_path, our_tokenizer):
    model = randomized(GPT(tiny_config(vocab_size=320)))
    save_model_files(tmp_path, model, our_tokenizer, meta={"stage": "base", "step": 1})
    other = train_tokenizer(["completely different text about ships and the sea"] * 30, vocab_size=300, verbose=False)
    other.save(tmp_path)
    with pytest.raises(CheckpointError, match="tokenizer/checkpoint mismatch"):
        load_for_inference(tmp_path, device="cpu", dtype="fp32")


def test_sources_resolve_from_stage_dirs_run_names_and_the_hub_cache(tmp_path, our_tokenizer, monkeypatch):
    import os
    import shutil

    home = Path(os.environ["PORTACHAT_HOME"])
    stage = home / "runs" / "r1" / "sft"
    (stage / "step_3").mkdir(parents=True)
    save_model_files(stage / "step_3", randomized(GPT(tiny_config(vocab_size=320))), our_tokenizer, {"step": 3})
    (stage / "latest").write_text("step_3\n")
    assert resolve(stage).path == stage / "step_3"
    assert resolve("r1/sft").path == stage / "step_3"
    assert load_for_inference("r1/sft", device="cpu", dtype="fp32").name == "r1-sft"

    # A Hub id already in the Hugging Face cache (never downloaded here): models--org--name/snapshots/<rev>.
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    snapshot = cache / "models--someorg--tiny" / "snapshots" / "abc123"
    shutil.copytree(stage / "step_3", snapshot)
    (cache / "models--someorg--tiny" / "refs").mkdir()
    (cache / "models--someorg--tiny" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    assert resolve("someorg/tiny").path == snapshot
    assert display_name(snapshot) == "someorg/tiny"
    with pytest.raises(CheckpointError, match="also looked in .* and the Hugging Face cache"):
        resolve("someorg/absent")

    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(UnsupportedConfigError, match="is a file but not a .gguf"):
        resolve(tmp_path / "notes.txt")
