"""The Embedder over a BERT encoder (all-MiniLM-L6-v2) and over our GPT: batching never changes a
vector, limits give clear errors, Matryoshka models shorten and renormalise."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from portachat.device import get_device
from portachat.engine.embeddings import (
    EmbeddingInputError,
    PoolingConfig,
    decoder_embedder,
    load_embedding_model,
)
from portachat.tokenizer.chat_tokenizer import PortachatChatTokenizer
from tests.minilm import minilm_dir
from tests.serve.api_testing import tiny_model

TEXTS = ["short", "a somewhat longer sentence about embeddings", "x " * 40, "the middle one, medium length"]


@pytest.fixture(scope="module")
def minilm():
    return load_embedding_model(minilm_dir(), get_device("cpu"), "fp32")


def test_batches_cut_by_token_budget_give_the_same_vectors_in_input_order(minilm):
    alone = torch.cat([minilm.embed_texts([t]) for t in TEXTS])
    small = dataclasses.replace(minilm, max_batch_tokens=64)  # forces several forwards
    torch.testing.assert_close(small.embed_texts(TEXTS), alone, atol=1e-5, rtol=0)
    torch.testing.assert_close(minilm.embed_texts(TEXTS), alone, atol=1e-5, rtol=0)
    assert torch.allclose(alone.norm(dim=-1), torch.ones(4), atol=1e-5)


def test_token_ids_get_the_special_tokens_text_gets(minilm):
    ids = minilm.encode("Hello world")
    assert minilm.with_special_tokens(ids) == minilm.tokenize("Hello world") == [101, *ids, 102]
    torch.testing.assert_close(minilm.embed_ids([minilm.with_special_tokens(ids)]), minilm.embed_texts(["Hello world"]))


def test_too_long_inputs_and_bad_ids_are_refused_with_the_limit(minilm):
    long_ids = minilm.tokenize("word " * 300)
    with pytest.raises(EmbeddingInputError, match="maximum input length is 256 tokens, but input 1 has 302") as err:
        minilm.embed_ids([minilm.tokenize("ok"), long_ids])
    assert err.value.index == 1 and err.value.code == "context_length_exceeded"
    assert len(minilm.truncate(long_ids)) == 256 and minilm.truncate(long_ids)[-1] == 102
    with pytest.raises(EmbeddingInputError, match="Token id 40000 in input 0 is outside"):
        minilm.embed_ids([[101, 40000, 102]])


def test_dimensions_only_for_models_trained_for_them(minilm):
    with pytest.raises(EmbeddingInputError, match="only makes 384-dimensional embeddings"):
        minilm.embed_texts(["hi"], dimensions=128)
    with pytest.raises(EmbeddingInputError, match="have 384 dimensions; dimensions=512 is larger"):
        minilm.embed_texts(["hi"], dimensions=512)
    assert minilm.embed_texts(["hi"], dimensions=384).shape == (1, 384)
    full = minilm.embed_texts(TEXTS)
    matryoshka = dataclasses.replace(minilm, pooling=dataclasses.replace(minilm.pooling, matryoshka=()))
    short = matryoshka.embed_texts(TEXTS, dimensions=64)
    torch.testing.assert_close(short, F.normalize(full[:, :64], dim=-1), atol=1e-5, rtol=0)
    listed = dataclasses.replace(minilm, pooling=dataclasses.replace(minilm.pooling, matryoshka=(64, 128)))
    with pytest.raises(EmbeddingInputError, match=r"supports dimensions in \[64, 128\]"):
        listed.embed_texts(["hi"], dimensions=100)


def test_decoder_pooling_reads_our_gpts_final_hidden_states(small_tokenizer):
    model = tiny_model(small_tokenizer.vocab_size, seed=3)
    tokenizer = PortachatChatTokenizer(small_tokenizer)
    last = decoder_embedder(model, tokenizer, PoolingConfig("last", False), bos=True, max_tokens=64)
    mean = decoder_embedder(model, tokenizer, PoolingConfig("mean", True), bos=True, max_tokens=64)
    texts = ["To be, or not to be", "that is the question: whether tis nobler in the mind to suffer"]
    ids = [[tokenizer.bos_id, *tokenizer.encode(t)] for t in texts]
    with torch.no_grad():
        states = [model.hidden_states(torch.tensor([x]))[0] for x in ids]
    want_last = torch.stack([s[-1] for s in states])
    want_mean = F.normalize(torch.stack([s.mean(0) for s in states]), dim=-1)
    torch.testing.assert_close(last.embed_texts(texts), want_last, atol=1e-5, rtol=1e-5)  # batched, right-padded
    torch.testing.assert_close(mean.embed_texts(texts), want_mean, atol=1e-5, rtol=1e-5)
    assert last.dimension == 64 and last.max_tokens == 64
    with pytest.raises(EmbeddingInputError, match="maximum input length is 64 tokens"):
        last.embed_ids([list(range(1, 70))])


def test_bf16_weights_stay_close_to_fp32(minilm):
    half = load_embedding_model(minilm_dir(), get_device("cpu"), "bf16")
    assert half.description.endswith("bfloat16")
    got, want = half.embed_texts(TEXTS), minilm.embed_texts(TEXTS)
    assert got.dtype == torch.float32  # vectors are returned in fp32 whatever the weights are
    assert (F.cosine_similarity(got, want) > 0.99).all()
