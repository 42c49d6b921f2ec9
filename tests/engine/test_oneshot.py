"""One batch through an engine built around a model the caller owns: samples, evals, parity checks."""

from __future__ import annotations

import copy

import pytest
import torch
from engine_testing import plain_greedy, prompts_of, tiny_model

from portachat.engine import EngineError, SamplingParams
from portachat.engine.oneshot import TokenIdsOnly, engine_for, generate_once


def test_greedy_batch_equals_full_forwards_per_prompt():
    model = tiny_model(96)
    prompts = prompts_of([1, 7, 20, 33], 96)
    replies = generate_once(model, prompts, SamplingParams(max_tokens=12, temperature=0.0))
    assert [r.token_ids for r in replies] == [plain_greedy(model, p, 12) for p in prompts]
    assert all(r.finish_reason == "length" and r.text == "" for r in replies)  # ids only: no stop, no text


def test_a_training_model_comes_back_as_it_was():
    """The engine casts, moves, packs and evals a model it owns; one it borrows must not notice."""
    model = tiny_model(96).train()
    model.requires_grad_(True)
    before = copy.deepcopy(model.state_dict())
    generate_once(model, prompts_of([5, 9], 96), SamplingParams(max_tokens=6, temperature=0.0))
    assert model.training and all(p.requires_grad for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())

    half = tiny_model(96).to(torch.bfloat16).eval()
    generate_once(half, prompts_of([5], 96), SamplingParams(max_tokens=3, temperature=0.0))
    assert not half.training and all(p.dtype == torch.bfloat16 for p in half.parameters())


def test_replies_may_run_past_the_models_context():
    model = tiny_model(96, max_seq_len=16)
    prompt = prompts_of([10], 96)[0]
    reply = generate_once(model, [prompt], SamplingParams(max_tokens=20, temperature=0.0))[0]
    assert reply.token_ids == plain_greedy(model, prompt, 20)


def test_seeded_sampling_repeats_and_stop_ids_end_a_reply(chat_tokenizer):
    model = tiny_model(chat_tokenizer.vocab_size)
    prompt = prompts_of([8], chat_tokenizer.vocab_size)[0]

    def sample(seed: int) -> list[int]:
        params = SamplingParams(max_tokens=16, temperature=1.0, seed=seed, ignore_eos=True)
        return generate_once(model, [prompt], params, chat_tokenizer)[0].token_ids

    assert sample(3) == sample(3) != sample(4)
    greedy = plain_greedy(model, prompt, 16)
    stop = greedy[5]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, stop_token_ids=[stop])
    stopped = generate_once(model, [prompt], params, chat_tokenizer)[0]
    assert stopped.token_ids == greedy[: greedy.index(stop) + 1] and stopped.finish_reason == "stop"


def test_engine_for_sizes_the_cache_for_its_batch_and_refuses_text_without_a_tokenizer():
    model = tiny_model(96)
    engine = engine_for(model, max_num_seqs=3, max_model_len=40)
    assert engine.max_model_len == 40 and engine.stats()["num_blocks"] == 3 * 3 + 1
    assert engine.dtype == torch.float32 and not engine.config.enable_prefix_caching
    with pytest.raises(EngineError, match="no tokenizer"):
        TokenIdsOnly(96).encode("hello")
    assert generate_once(model, [], SamplingParams(max_tokens=4)) == []
