"""Teacher-forced log-probabilities through the engine's paged cache equal a plain full forward."""

from __future__ import annotations

import math

import pytest
import torch
from engine_testing import make_engine, prompts_of, tiny_model

from portachat.engine.scoring import perplexity, teacher_forced_logprobs
from portachat.engine.types import EngineError


@torch.inference_mode()
def full_forward_logprobs(model, tokens: list[int]) -> list[float]:
    logp = torch.log_softmax(model(torch.tensor([tokens]))[0].float(), dim=-1)
    return [float(logp[i, tokens[i + 1]]) for i in range(len(tokens) - 1)]


@pytest.mark.parametrize("padded", [False, True], ids=["eager", "padded-decode"])
def test_scores_equal_a_full_forward_and_blocks_come_back(chat_tokenizer, padded):
    model = tiny_model(chat_tokenizer.vocab_size, seed=1)
    engine = make_engine(chat_tokenizer, model=tiny_model(chat_tokenizer.vocab_size, seed=1), max_num_seqs=4)
    if padded:
        engine.runner.enable_decode_graphs(4, capturer=None)
    texts = prompts_of([30, 7, 19], chat_tokenizer.vocab_size, seed=2)  # different lengths: rows drop out
    got = teacher_forced_logprobs(engine, texts)
    for text, row in zip(texts, got, strict=True):
        assert len(row) == len(text) - 1
        torch.testing.assert_close(torch.tensor(row), torch.tensor(full_forward_logprobs(model, text)),
                                   atol=1e-4, rtol=1e-4)  # fmt: skip
    assert engine.blocks.num_free == engine.blocks.num_blocks
    flat = [x for row in got for x in row]
    assert perplexity(got) == pytest.approx(math.exp(-sum(flat) / len(flat)))


def test_bad_inputs_are_refused(chat_tokenizer):
    engine = make_engine(chat_tokenizer, num_blocks=4, block_size=4, max_model_len=16)
    with pytest.raises(ValueError, match="at least two tokens"):
        teacher_forced_logprobs(engine, [[1]])
    with pytest.raises(ValueError, match="longer than the context"):
        teacher_forced_logprobs(engine, [list(range(17))])
    with pytest.raises(EngineError, match="free KV blocks"):
        teacher_forced_logprobs(engine, [list(range(16)), list(range(16))])  # 8 blocks of 4 needed
    assert engine.blocks.num_free == 4
