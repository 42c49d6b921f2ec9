"""Teacher-forced log-probabilities through the engine's paged cache, and a prompt's top-k log-probabilities
in one engine step, equal a plain full forward."""

from __future__ import annotations

import math

import pytest
import torch
from engine_testing import make_engine, prompts_of, tiny_model

from portachat.engine.scoring import perplexity, prompt_top_logprobs, teacher_forced_logprobs
from portachat.engine.types import EngineError, SamplingParams


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


def greedy_tokens(engine, prompt: list[int], score: list[int] | None = None) -> list[int]:
    """A greedy request's tokens; with `score`, that prompt is scored between two of its steps."""
    engine.add_request(prompt, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True), "r")
    tokens: list[int] = []
    steps = 0
    while engine.has_unfinished():
        for out in engine.step():
            tokens += out.token_ids
        steps += 1
        if steps == 3 and score is not None:
            prompt_top_logprobs(engine, score, 4)
    return tokens


def test_prompt_top_k_in_one_step_equals_a_full_forward_and_leaves_running_requests_alone(chat_tokenizer):
    model = tiny_model(chat_tokenizer.vocab_size, seed=1)
    engine = make_engine(chat_tokenizer, model=tiny_model(chat_tokenizer.vocab_size, seed=1), max_model_len=64)
    prompt = prompts_of([37], chat_tokenizer.vocab_size, seed=3)[0]
    got = prompt_top_logprobs(engine, prompt, 5)
    with torch.inference_mode():
        logp = torch.log_softmax(model(torch.tensor([prompt]))[0].float(), dim=-1)[:-1]
    values, ids = logp.topk(5, dim=-1)
    assert torch.equal(torch.tensor(got.top_ids), ids)
    torch.testing.assert_close(torch.tensor(got.top_logprobs), values, atol=1e-4, rtol=0)
    own = logp.gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(got.token_logprobs), own, atol=1e-4, rtol=0)
    assert got.token_ranks == ((logp > own[:, None]).sum(1) + 1).tolist()
    assert engine.blocks.num_free == engine.blocks.num_blocks
    assert prompt_top_logprobs(engine, prompt[:1], 5).top_ids == []
    with pytest.raises(EngineError, match="--max-model-len"):
        prompt_top_logprobs(engine, list(range(65)), 5)
    other = prompts_of([9], chat_tokenizer.vocab_size, seed=4)[0]
    assert greedy_tokens(engine, other, score=prompt) == greedy_tokens(make_engine(chat_tokenizer, model=tiny_model(
        chat_tokenizer.vocab_size, seed=1), max_model_len=64), other)
