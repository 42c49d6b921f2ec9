"""`export gguf`: transformers' GGUF loader reproduces our logits and our tokenizer."""

from __future__ import annotations

import pytest
import torch
from export_testing import make_checkpoint

from portachat.export import ExportError, export_gguf
from portachat.tokenizer.bpe import SPLIT_PATTERN

TEXTS = ["ROMEO: But soft, what light through yonder window breaks?", "year 2024: 1234567\n\n  indented", "café 😀"]


def _gguf_metadata(path):
    from portachat.model.gguf import read_gguf_metadata

    return read_gguf_metadata(path)


def _transformers_logits(path, ids):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(ids).logits


def _rounded(model, dtype):
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(p.to(dtype).float())
    return model


@pytest.mark.parametrize(
    "type_, arch", [("f32", "qwen3"), ("f16", "qwen3"), ("f32", "llama"), ("f16", "llama"), ("f32", "qwen3-tied")]
)
def test_transformers_reads_our_gguf_with_the_same_logits(tmp_path, small_tokenizer, type_, arch):
    overrides = {
        "qwen3": {},
        "qwen3-tied": dict(tie_embeddings=True),
        "llama": dict(architecture="llama", qk_norm=False),
    }[arch]
    arch = arch.removesuffix("-tied")
    path, model = make_checkpoint(tmp_path / "ckpt", small_tokenizer, **overrides)
    result = export_gguf(path, tmp_path / "m.gguf", type_=type_)
    assert result.architecture == arch and result.pre_tokenizer == "qwen2"
    ids = torch.tensor([small_tokenizer.encode(TEXTS[0])])
    if type_ == "f16":  # the file holds fp16 matrices: the original model at that precision
        model = _rounded(model, torch.float16)
    with torch.no_grad():
        ours = model(ids)
    assert (ours - _transformers_logits(result.path, ids)).abs().max() < 1e-3


def test_gguf_tokenizer_metadata_names_our_split_pattern(tmp_path, checkpoint, small_tokenizer):
    from transformers import AutoTokenizer
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS

    path = export_gguf(checkpoint[0], tmp_path / "m.gguf", type_="f32").path
    meta = _gguf_metadata(path)
    assert meta["tokenizer.ggml.model"] == "gpt2"
    assert GGUF_PRE_TOKENIZER_SPLITS[meta["tokenizer.ggml.pre"]] == SPLIT_PATTERN
    assert meta["tokenizer.ggml.bos_token_id"] == small_tokenizer.bos_id
    assert meta["tokenizer.ggml.eos_token_id"] == small_tokenizer.eos_id
    hf_tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    for text in TEXTS:
        assert hf_tok(text, add_special_tokens=False)["input_ids"] == small_tokenizer.encode(text), text


def test_q8_0_is_small_and_close(tmp_path, checkpoint, small_tokenizer):
    f32 = export_gguf(checkpoint[0], tmp_path / "a.gguf", type_="f32")
    q8 = export_gguf(checkpoint[0], tmp_path / "b.gguf", type_="q8_0")
    assert q8.bytes < 0.4 * f32.bytes
    ids = torch.tensor([small_tokenizer.encode(TEXTS[1])])
    with torch.no_grad():
        ours = checkpoint[1](ids)
    theirs = _transformers_logits(q8.path, ids)
    assert (ours - theirs).abs().max() < 0.03 * ours.abs().max()


def test_our_gguf_reader_loads_the_export(tmp_path, checkpoint, small_tokenizer):
    from portachat.model.load import load_for_inference

    path = export_gguf(checkpoint[0], tmp_path / "m.gguf", type_="f32").path
    loaded = load_for_inference(path, device="cpu", dtype="fp32")
    ids = torch.tensor([small_tokenizer.encode(TEXTS[0])])
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(ids), checkpoint[1](ids), atol=1e-4, rtol=0)


def test_old_split_pattern_cannot_be_exported_and_says_why(tmp_path, small_tokenizer):
    from export_testing import LEGACY_SPLIT_PATTERN
    from tokenizers import Regex, pre_tokenizers

    from portachat.tokenizer import Tokenizer

    hf = small_tokenizer._hf.__class__.from_str(small_tokenizer._hf.to_str())
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(pattern=Regex(LEGACY_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    path, _ = make_checkpoint(tmp_path / "old", Tokenizer(hf))
    with pytest.raises(ExportError, match="llama.cpp has no name for") as info:
        export_gguf(path, tmp_path / "m.gguf")
    assert "portachat export hf" in str(info.value)
    assert not (tmp_path / "m.gguf").exists() and not list(tmp_path.glob(".tmp-*"))


def test_bad_type_is_refused(tmp_path, checkpoint):
    with pytest.raises(ExportError, match="valid values: f32, f16, q8_0"):
        export_gguf(checkpoint[0], tmp_path / "m.gguf", type_="q4_0")
