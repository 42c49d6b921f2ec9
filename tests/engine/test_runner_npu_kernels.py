"""The engine's decode steps through Ascend's paged-attention and cache-write kernels (stand-ins implementing
their documented semantics, tests/fakes/torch_npu_standin.py, on a simulated Atlas A2 whose tensors live on
the CPU): where both pass their self-tests the cache is slot-major, every K/V write and decode attention
goes through them, and the greedy tokens are the portable path's; a wrong or crashing kernel is rejected
by its self-test (or, crashing in use, dropped with its reason said once) and the tokens do not change."""

from __future__ import annotations

import pytest
import torch
from engine_testing import make_engine, plain_greedy, prompts_of

from portachat.engine import SamplingParams
from portachat.ops import npu_attention
from portachat.ops.paged_attention import write_kv
from tests.fakes import forget_fast_path_answers
from tests.fakes import torch_npu_standin as standin
from tests.fakes.ascend_device import ascend_a2, on_ascend

KERNELS = ("_npu_paged_attention", "_npu_reshape_and_cache")
PARAMS = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.fixture(autouse=True)
def _fresh():
    forget_fast_path_answers()
    yield
    forget_fast_path_answers()


def _prompts(vocab: int) -> list[list[int]]:
    """Different lengths (padded decode rows, partly filled blocks) and a shared prefix (a continued chunk
    reading the slot-major cache through the portable prefill)."""
    prompts = prompts_of([3, 17, 9, 30], vocab)
    return prompts + [prompts[1] + [5, 6, 7]]


def _generate(tokenizer, prompts: list[list[int]]) -> tuple[list[list[int]], object]:
    # 8 tokens a step: prompts prefill in chunks beside running decodes
    engine = make_engine(tokenizer, max_num_batched_tokens=8)
    return [c.token_ids for c in engine.generate(prompts, PARAMS)], engine


def _counting(mod) -> dict[str, int]:
    calls = dict.fromkeys(KERNELS, 0)
    for name in KERNELS:
        real = getattr(mod, name)

        def counted(*a, _real=real, _name=name, **k):
            calls[_name] += 1
            return _real(*a, **k)

        setattr(mod, name, counted)
    return calls


def test_decode_and_cache_writes_run_through_the_kernels_with_the_portable_tokens(monkeypatch, chat_tokenizer):
    prompts = _prompts(chat_tokenizer.vocab_size)
    want, portable = _generate(chat_tokenizer, prompts)
    assert not portable.stats()["paged_kernels"] and portable.runner.k_cache.is_contiguous()
    mod = standin.module()
    calls = _counting(mod)
    standin.install(monkeypatch, mod)
    on_ascend(monkeypatch, ascend_a2())
    got, engine = _generate(chat_tokenizer, prompts)
    assert got == want
    assert got[0] == plain_greedy(engine.model, prompts[0], PARAMS.max_tokens)
    runner = engine.runner
    assert engine.stats()["paged_kernels"] and runner.k_cache.transpose(1, 2).is_contiguous()  # [layers, slots, H_kv, D] memory
    assert not engine.uses_decode_graphs and "paged-attention" in engine.graphs_reason
    assert not engine.compiled and "paged-attention" in engine.compile_reason
    # beyond the self-tests' one call each: every layer of every step writes and of every decode step
    # attends (a sequence's tokens after its first each come from a decode step)
    at_least = 1 + engine.model.config.n_layer * (PARAMS.max_tokens - 1)
    assert calls["_npu_reshape_and_cache"] > at_least and calls["_npu_paged_attention"] > at_least


@pytest.mark.parametrize("bad", ["wrong", "crashing"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_a_kernel_failing_its_self_test_leaves_the_portable_cache_and_tokens(monkeypatch, capsys, chat_tokenizer,
                                                                          kernel, bad):  # fmt: skip
    prompts = _prompts(chat_tokenizer.vocab_size)[:3]
    want, _engine = _generate(chat_tokenizer, prompts)
    standin.install(monkeypatch, getattr(standin, bad)(kernel))
    on_ascend(monkeypatch, ascend_a2())
    got, engine = _generate(chat_tokenizer, prompts)
    assert got == want
    assert not engine.runner.slot_major and engine.runner.k_cache.is_contiguous()
    name = {"_npu_paged_attention": "npu_paged_attention", "_npu_reshape_and_cache": "npu_reshape_and_cache"}[kernel]
    assert capsys.readouterr().err.count(f"fast path {name} is off") == 1


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_kernel_crashing_in_use_falls_back_once_with_its_reason(monkeypatch, capsys, chat_tokenizer, kernel):
    """Passed its self-test, raises on the engine's inputs: that step and every later one run the portable
    path over the same (slot-major) memory, the reason said once."""
    prompts = _prompts(chat_tokenizer.vocab_size)
    want, _engine = _generate(chat_tokenizer, prompts)
    mod = standin.module()
    standin.install(monkeypatch, mod)
    on_ascend(monkeypatch, ascend_a2())
    engine = make_engine(chat_tokenizer, max_num_batched_tokens=8)
    assert engine.runner.slot_major
    calls = []

    def crash(*a, **k):
        calls.append(1)
        raise RuntimeError("EZ9999: the AI core raised an exception (stand-in crash)")

    setattr(mod, kernel, crash)
    got = [c.token_ids for c in engine.generate(prompts, PARAMS)]
    assert got == want
    assert len(calls) == 1  # tried once, then off
    err = capsys.readouterr().err
    assert err.count("is off") == 1 and "EZ9999" in err
    again = [c.token_ids for c in engine.generate(prompts[:1], PARAMS)]
    assert again == want[:1] and len(calls) == 1


def test_the_slot_major_cache_is_the_head_major_view_of_the_kernels_blocks():
    """allocate / blocks: what the portable write puts at slot s is what the kernel layout holds at
    [s // block_size, s % block_size] (the same memory)."""
    kc, vc = (npu_attention.allocate((2, 3, 32, 8), torch.float32, "cpu") for _ in range(2))
    slots = torch.tensor([0, 5, 17, 31])
    k, v = torch.randn(4, 3, 8), torch.randn(4, 3, 8)
    write_kv(kc[1], vc[1], slots, k, v)
    blocks = npu_attention.blocks(kc[1], 8)
    assert blocks.shape == (4, 8, 3, 8) and blocks.data_ptr() == kc[1].data_ptr()
    torch.testing.assert_close(blocks[slots // 8, slots % 8], k, rtol=0, atol=0)
    torch.testing.assert_close(npu_attention.slot_major(kc[1].contiguous(), 8), blocks, rtol=0, atol=0)
