"""The engine's greedy output equals plain full-sequence greedy decoding, however requests are batched."""

from __future__ import annotations

import torch
from engine_testing import make_engine, plain_greedy, plain_logprobs, prompts_of

from portachat.engine import SamplingParams


def test_concurrent_greedy_equals_plain_forward(chat_tokenizer):
    engine = make_engine(chat_tokenizer)
    prompts = prompts_of([3, 17, 9, 30, 1], chat_tokenizer.vocab_size)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    got = engine.generate(prompts, params)
    for prompt, completion in zip(prompts, got, strict=True):
        assert completion.token_ids == plain_greedy(engine.model, prompt, 12)
        assert completion.finish_reason == "length"
        assert completion.completion_tokens == 12 and completion.prompt_tokens == len(prompt)
    assert engine.stats()["kv_cache_usage"] == 0.0  # everything freed


def test_requests_joining_at_different_steps(chat_tokenizer):
    """Continuous batching: new requests join mid-flight, prefill in chunks beside running decodes."""
    engine = make_engine(chat_tokenizer, max_num_batched_tokens=8)
    prompts = prompts_of([25, 6, 19, 2], chat_tokenizer.vocab_size, seed=1)
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    ids: dict[str, list[int]] = {}
    joined = {}
    step = 0
    while len(joined) < len(prompts) or engine.has_unfinished():
        if step % 3 == 0 and len(joined) < len(prompts):
            i = len(joined)
            joined[engine.add_request(prompts[i], params)] = i
        for out in engine.step():
            ids.setdefault(out.request_id, []).extend(out.token_ids)
        step += 1
    for rid, i in joined.items():
        assert ids[rid] == plain_greedy(engine.model, prompts[i], 10), f"prompt {i}"


def test_prefix_reuse_keeps_outputs_and_hits(chat_tokenizer):
    engine = make_engine(chat_tokenizer)
    shared = prompts_of([16], chat_tokenizer.vocab_size, seed=2)[0]
    prompts = [shared + [5, 6, 7], shared + [9], shared + [5, 6, 7]]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    first = engine.generate(prompts[:1], params)[0]
    rest = engine.generate(prompts[1:], params)
    assert engine.stats()["prefix_cache_hits"] >= 4  # the 16 shared tokens = 4 blocks of 4, reused
    for prompt, completion in zip(prompts, [first, *rest], strict=True):
        assert completion.token_ids == plain_greedy(engine.model, prompt, 6)


def test_logprobs_equal_log_softmax_of_plain_forward(chat_tokenizer):
    engine = make_engine(chat_tokenizer)
    prompts = prompts_of([5, 11], chat_tokenizer.vocab_size, seed=3)
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, logprobs=True)
    for prompt, c in zip(prompts, engine.generate(prompts, params), strict=True):
        expected = plain_logprobs(engine.model, prompt, c.token_ids)
        assert torch.allclose(torch.tensor(c.logprobs), torch.tensor(expected), atol=1e-4)


def test_packed_weights_match_the_plain_forward(chat_tokenizer):
    """A frozen model runs through packed CPU kernels; a model still training is never packed."""
    from engine_testing import tiny_model

    model = tiny_model(chat_tokenizer.vocab_size, seed=4).requires_grad_(False)
    engine = make_engine(chat_tokenizer, model=model)
    prompts = prompts_of([6, 15], chat_tokenizer.vocab_size, seed=13)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=True)
    for prompt, c in zip(prompts, engine.generate(prompts, params), strict=True):
        assert c.token_ids == plain_greedy(model, prompt, 8)
        assert torch.allclose(
            torch.tensor(c.logprobs), torch.tensor(plain_logprobs(model, prompt, c.token_ids)), atol=1e-4
        )
    training = make_engine(chat_tokenizer, model=tiny_model(chat_tokenizer.vocab_size, seed=4))
    assert training.stats()["packed_weights"] is False


def test_reload_weights_after_an_in_place_update(chat_tokenizer):
    from engine_testing import tiny_model

    model = tiny_model(chat_tokenizer.vocab_size, seed=5).requires_grad_(False)
    engine = make_engine(chat_tokenizer, model=model)
    prompt = prompts_of([9], chat_tokenizer.vocab_size, seed=14)[0]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    before = engine.generate([prompt], params)[0].token_ids
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.5)
    engine.reload_weights()
    after = engine.generate([prompt], params)[0].token_ids
    assert after == plain_greedy(model, prompt, 6) and after != before


def test_bf16_engine_tracks_the_bf16_plain_forward(chat_tokenizer):
    from engine_testing import tiny_model

    model = tiny_model(chat_tokenizer.vocab_size, seed=6).requires_grad_(False)
    engine = make_engine(chat_tokenizer, model=model, dtype="bf16")
    prompt = prompts_of([12], chat_tokenizer.vocab_size, seed=15)[0]
    c = engine.generate(
        [prompt], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=True)
    )[0]
    expected = plain_logprobs(model, prompt, c.token_ids)  # model is bf16 now: same weights, plain path
    assert torch.allclose(torch.tensor(c.logprobs), torch.tensor(expected), atol=0.15)


def test_a_training_model_keeps_its_dtype_and_device_policy_casts_a_frozen_one(chat_tokenizer):
    from engine_testing import tiny_model

    from portachat.device import get_device
    from portachat.engine import EngineConfig, LLMEngine
    from portachat.ops.inference_dtype import inference_dtype

    training = tiny_model(chat_tokenizer.vocab_size)
    LLMEngine(training, chat_tokenizer, EngineConfig(num_blocks=16, block_size=16), device=get_device("cpu"))
    assert training.lm_head.weight.dtype == torch.float32
    frozen = tiny_model(chat_tokenizer.vocab_size).requires_grad_(False)
    engine = LLMEngine(
        frozen, chat_tokenizer, EngineConfig(num_blocks=16, block_size=16), device=get_device("cpu")
    )
    assert frozen.lm_head.weight.dtype == engine.dtype == inference_dtype(get_device("cpu")).value


def test_the_kv_block_size_is_the_devices_unless_given(chat_tokenizer):
    """128-token blocks on Ascend (its paged kernels' layout), 64 on a DCU with flash attention, 16 elsewhere;
    an explicit block_size wins."""
    from engine_testing import tiny_model

    from portachat.device import get_device
    from portachat.device.fast_path_choice import kv_block_size
    from portachat.engine import EngineConfig, LLMEngine

    assert kv_block_size("npu", "npu_fusion_attention")[0] == 128
    assert kv_block_size("dcu", "flash_attn")[0] == 64 and kv_block_size("dcu", "sdpa")[0] == 16
    assert kv_block_size("cuda", "sdpa")[0] == kv_block_size("cpu", "sdpa")[0] == 16
    model = tiny_model(chat_tokenizer.vocab_size)
    auto = LLMEngine(model, chat_tokenizer, EngineConfig(num_blocks=64, dtype="fp32"), device=get_device("cpu"))
    assert auto.config.block_size == auto.blocks.block_size == auto.runner.block_size == 16
    given = LLMEngine(model, chat_tokenizer, EngineConfig(num_blocks=64, block_size=8, dtype="fp32"),
                      device=get_device("cpu"))  # fmt: skip
    assert given.blocks.block_size == 8
