"""A decoder embedding model in sentence-transformers' layout (a Qwen3 base model, last-token pooling, a
trailing end-of-text token from the tokenizer's post-processor, as Qwen3-Embedding ships) gives
sentence-transformers' vectors through our GPT (fp32)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from portachat.device import get_device
from portachat.engine.embeddings import is_embedding_model, load_embedding_model

TEXTS = ["To be, or not to be, that is the question", "Whether tis nobler in the mind to suffer",
         "The slings and arrows of outrageous fortune", "Or to take arms against a sea of troubles"]


def _tokenizer(directory: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXTS * 10, trainer)
    eos = tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", eos)])
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
        "model_max_length": 128}))


@pytest.fixture()
def qwen3_embedding_dir(tmp_path) -> Path:
    transformers = pytest.importorskip("transformers")
    directory = tmp_path / "qwen3-embedding-tiny"
    directory.mkdir()
    _tokenizer(directory)
    vocab = json.loads((directory / "tokenizer.json").read_text())["model"]["vocab"]
    config = transformers.Qwen3Config(vocab_size=len(vocab) + 1, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      max_position_embeddings=128, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.Qwen3Model(config)
    with torch.no_grad():
        for p in model.parameters():  # larger than the init's 0.02 so that the layers matter
            p.add_(torch.randn_like(p) * 0.2)
    model.save_pretrained(directory)
    (directory / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (directory / "1_Pooling").mkdir()
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 64, "pooling_mode_lasttoken": True, "pooling_mode_mean_tokens": False}))
    (directory / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64}))
    return directory


@pytest.mark.parametrize("lowercase", [False, True])
def test_qwen3_embedding_layout_matches_sentence_transformers(qwen3_embedding_dir, lowercase):
    st = pytest.importorskip("sentence_transformers")
    # do_lower_case: sentence-transformers lowercases texts first (this byte-level tokenizer does not itself).
    (qwen3_embedding_dir / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64,
                                                                                "do_lower_case": lowercase}))
    assert is_embedding_model(qwen3_embedding_dir)
    ours = load_embedding_model(qwen3_embedding_dir, get_device("cpu"), "fp32")
    assert ours.pooling.pooling == "last" and ours.suffix and not ours.prefix and ours.max_tokens == 64
    reference = st.SentenceTransformer(str(qwen3_embedding_dir), device="cpu").encode(TEXTS, convert_to_tensor=True)
    got = ours.embed_texts(TEXTS)
    torch.testing.assert_close(got, reference.float(), atol=1e-5, rtol=0)
    assert "qwen3 decoder" in ours.description
    assert ours.pooling.lowercase is lowercase and (ours.tokenize("To be") == ours.tokenize("to be")) is lowercase
