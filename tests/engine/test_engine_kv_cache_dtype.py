"""--kv-cache-dtype in the engine: int8 keys/values through every decode path stay close to the fp32
cache (logits, greedy tokens, SmolLM2 perplexity), and --kv-cache-gb holds ~2x / ~4x the tokens."""

from __future__ import annotations

import pytest
import torch
from engine_testing import make_engine, plain_greedy, prompts_of, tiny_model
from smollm2 import smollm2_gguf_path

from portachat.device import get_device
from portachat.engine import EngineConfig, LLMEngine, SamplingParams
from portachat.engine.scoring import perplexity, teacher_forced_logprobs
from portachat.engine.types import EngineError
from portachat.ops.kv_quant import QuantizedKV


def tame_model(vocab_size: int, seed: int = 3, **overrides):
    """A random model whose logits depend smoothly on its inputs (weights of std 0.2): the test
    models' std 0.5 amplifies any rounding, bf16's included, into a different argmax."""
    model = tiny_model(vocab_size, seed=seed, **overrides)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (1.0 if p.dim() == 1 else 0.0))
    return model


def engine_pair(tokenizer, **config):
    """fp32-cache and int8-cache engines over copies of the same model."""
    model = config.pop("model", {})
    return [make_engine(tokenizer, model=tame_model(tokenizer.vocab_size, **model), kv_cache_dtype=kv, **config)
            for kv in ("fp32", "int8")]  # fmt: skip


@pytest.mark.parametrize("modules", [False, True], ids=["packed", "modules"])
def test_int8_cache_logprobs_match_the_fp32_cache(chat_tokenizer, modules):
    model = dict(architecture="llama", qk_norm=False) if modules else {}
    exact, int8 = engine_pair(chat_tokenizer, model=model)
    if modules:  # the module path, as on accelerators
        for e in (exact, int8):
            e.runner.packed = None
    assert isinstance(int8.runner.k_cache, QuantizedKV) and int8.runner.k_cache.dtype == torch.int8
    assert int8.stats()["kv_cache_dtype"] == "int8" and exact.stats()["kv_cache_dtype"] == "float32"
    texts = prompts_of([40, 25, 33], chat_tokenizer.vocab_size, seed=1)
    want, got = teacher_forced_logprobs(exact, texts), teacher_forced_logprobs(int8, texts)
    diff = max(abs(a - b) for w, g in zip(want, got, strict=True) for a, b in zip(w, g, strict=True))
    assert 0 < diff < 0.25  # different, as a quantized cache must be, and close (a bf16 cache: 0.08 here)
    assert abs(perplexity(got) / perplexity(want) - 1) < 0.01


def test_int8_cache_greedy_tokens_equal_the_fp32_cache(chat_tokenizer):
    # A 32-token vocabulary: a random model's top two logits over 384 tokens are often within
    # rounding of each other, and then even a bf16 cache picks the other one.
    vocab = 32
    exact, int8 = (make_engine(chat_tokenizer, model=tame_model(vocab), kv_cache_dtype=kv) for kv in ("fp32", "int8"))
    prompts = prompts_of([40, 25, 33], vocab + 20, seed=1)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    want = [c.token_ids for c in exact.generate(prompts, params)]
    model = tame_model(vocab)
    for prompt, out in zip(prompts, want, strict=True):
        assert out == plain_greedy(model, prompt, 12)
        with torch.inference_mode():
            top2 = model(torch.tensor([prompt + out]))[0, len(prompt) - 1 :].topk(2, dim=-1).values
        assert (top2[:, 0] - top2[:, 1]).min() > 0.03  # no near-ties: any flip would be the cache's
    # Prompts longer than a step's 16 tokens: later chunks read their own keys back from the cache.
    assert [c.token_ids for c in int8.generate(prompts, params)] == want


def test_prefix_blocks_reused_from_an_int8_cache_keep_their_scales(chat_tokenizer):
    vocab = 32
    engine = make_engine(chat_tokenizer, model=tame_model(vocab), kv_cache_dtype="int8")
    shared = prompts_of([16], vocab + 20, seed=2)[0]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=True)
    first = engine.generate([shared + [5, 6, 7]], params)[0]
    again = engine.generate([shared + [5, 6, 7]], params)[0]
    assert engine.stats()["prefix_cache_hits"] >= 4  # 16 shared tokens = 4 blocks of 4, read back quantized
    # The first time the prompt's first chunk attended over its own unquantized keys: close, not equal.
    assert again.token_ids == first.token_ids
    torch.testing.assert_close(torch.tensor(again.logprobs), torch.tensor(first.logprobs), atol=0.05, rtol=0)


def test_int8_cache_in_padded_decode_steps_gives_the_eager_tokens(chat_tokenizer):
    # The graph path's static buffers and scratch block (captured on accelerators; eager here).
    tokens = []
    for padded in (False, True):
        engine = make_engine(chat_tokenizer, model=tame_model(chat_tokenizer.vocab_size, architecture="llama",
                                                              qk_norm=False),
                             kv_cache_dtype="int8", max_num_seqs=8, max_num_batched_tokens=64)  # fmt: skip
        engine.runner.packed = None
        if padded:
            engine.runner.enable_decode_graphs(8, capturer=None)
        prompts = prompts_of([9, 3, 14, 1, 30], chat_tokenizer.vocab_size, seed=4)
        params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (12, 3, 9, 12, 5)]
        tokens.append([c.token_ids for c in engine.generate(prompts, params)])
    assert tokens[0] == tokens[1]
    scratch = engine.runner.scratch_block * engine.runner.block_size
    assert engine.runner.k_cache.scale[:, :, scratch:].abs().sum() > 0  # padded rows wrote the scratch block


def test_kv_cache_gb_holds_2x_bf16_and_4x_fp32_tokens_in_int8(chat_tokenizer):
    blocks = {}
    for kv in ("fp32", "bf16", "int8"):
        e = make_engine(chat_tokenizer, num_blocks=None, kv_cache_gb=0.001, kv_cache_dtype=kv)
        blocks[kv] = e.blocks.num_blocks
        cache = e.runner.k_cache
        per_layer = (cache.data.nbytes + cache.scale.nbytes) if kv == "int8" else cache.nbytes
        # What is allocated is what was budgeted: K and V, every layer, the scratch block on top.
        assert 2 * per_layer == pytest.approx(0.001 * 2**30 * (blocks[kv] + 1) / blocks[kv], rel=0.01)
    # head_dim 16: one fp32 scale per 16 int8 values costs 25% here (6% at SmolLM2's 64).
    assert blocks["int8"] / blocks["bf16"] == pytest.approx(2 * 16 / 20, rel=0.02)
    assert blocks["int8"] / blocks["fp32"] == pytest.approx(4 * 16 / 20, rel=0.02)
    assert blocks["int8"] > 1.5 * blocks["bf16"] and blocks["int8"] > 3 * blocks["fp32"]


def test_fp8_on_a_cpu_is_refused_naming_what_works(chat_tokenizer):
    with pytest.raises(EngineError, match="fp8 needs native fp8.*int8") as info:
        make_engine(chat_tokenizer, kv_cache_dtype="fp8")
    assert info.value.kind == "invalid"


@pytest.mark.slow
def test_smollm2_int8_cache_perplexity_within_one_percent_of_fp32(shakespeare_path):
    from portachat.model.load import load_for_inference

    loaded = load_for_inference(smollm2_gguf_path(), device="cpu", dtype="fp32")
    tokens = loaded.tokenizer.encode(shakespeare_path.read_text(encoding="utf-8")[:3000])
    segments = [tokens[i : i + 48] for i in range(0, 4 * 48, 48)]  # decoded together, a token a step
    ppl = {}
    for kv in ("fp32", "int8"):  # two engines over one model (frozen: each packs its own copy)
        config = EngineConfig(dtype="model", max_model_len=48, max_num_seqs=4, compile=False, kv_cache_dtype=kv)
        engine = LLMEngine(loaded.model, loaded.tokenizer, config, device=get_device("cpu"))
        ppl[kv] = perplexity(teacher_forced_logprobs(engine, segments))
    assert 2 < ppl["fp32"] < 200  # the real model reading real text
    assert ppl["int8"] != ppl["fp32"]
    assert abs(ppl["int8"] / ppl["fp32"] - 1) < 0.01
