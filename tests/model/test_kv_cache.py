from __future__ import annotations

import pytest
import torch
from gpt_testing import randomized, tiny_config

from portachat.model import GPT, KVCache, KVCacheError

TOL = dict(atol=1e-5, rtol=1e-5)


def new_cache(model: GPT, num_slots: int = 4, max_len: int = 64) -> KVCache:
    return KVCache.for_model(model.config, num_slots=num_slots, max_len=max_len)


def test_prefill_then_decode_equals_full_forward(tiny_model):
    seq = torch.randint(0, 128, (2, 20))
    full = tiny_model(seq)
    cache = new_cache(tiny_model)
    with torch.inference_mode():
        chunks = [tiny_model(seq[:, :12], kv_cache=cache)]
        for t in range(12, 20):
            chunks.append(tiny_model(seq[:, t : t + 1], kv_cache=cache))
    torch.testing.assert_close(torch.cat(chunks, dim=1), full, **TOL)
    assert cache.lengths.tolist() == [20, 20, 0, 0]


def test_chunked_prefill_equals_full_forward(tiny_model):
    seq = torch.randint(0, 128, (1, 18))
    cache = new_cache(tiny_model)
    parts = [tiny_model(seq[:, a:b], kv_cache=cache, slots=[2]) for a, b in ((0, 5), (5, 13), (13, 18))]
    torch.testing.assert_close(torch.cat(parts, dim=1), tiny_model(seq), **TOL)
    assert cache.lengths.tolist() == [0, 0, 18, 0]


def test_slots_at_different_lengths_decode_together(tiny_model):
    a = torch.randint(0, 128, (1, 15))
    b = torch.randint(0, 128, (1, 6))
    cache = new_cache(tiny_model)
    tiny_model(a[:, :9], kv_cache=cache, slots=[3])
    tiny_model(b[:, :2], kv_cache=cache, slots=[1])
    steps = []
    for i in range(4):  # slot 3 continues from position 9, slot 1 from position 2, in one batch
        idx = torch.stack([a[0, 9 + i : 10 + i], b[0, 2 + i : 3 + i]])
        steps.append(tiny_model(idx, kv_cache=cache, slots=torch.tensor([3, 1])))
    steps = torch.cat(steps, dim=1)
    torch.testing.assert_close(steps[0], tiny_model(a[:, :13])[0, 9:], **TOL)
    torch.testing.assert_close(steps[1], tiny_model(b)[0, 2:], **TOL)
    assert cache.lengths.tolist() == [0, 6, 0, 13]


def test_multi_token_step_with_different_starts(tiny_model):
    """Rows continue by several tokens each from different positions (speculative / chunked steps)."""
    a, b = torch.randint(0, 128, (1, 12)), torch.randint(0, 128, (1, 12))
    cache = new_cache(tiny_model)
    tiny_model(a[:, :7], kv_cache=cache, slots=[0])
    tiny_model(b[:, :3], kv_cache=cache, slots=[1])
    out = tiny_model(torch.cat([a[:, 7:10], b[:, 3:6]]), kv_cache=cache)
    torch.testing.assert_close(out[0], tiny_model(a[:, :10])[0, 7:], **TOL)
    torch.testing.assert_close(out[1], tiny_model(b[:, :6])[0, 3:], **TOL)


def test_reset_reuses_a_slot(tiny_model):
    cache = new_cache(tiny_model, num_slots=2, max_len=16)
    tiny_model(torch.randint(0, 128, (1, 14)), kv_cache=cache, slots=[1])
    cache.reset([1])
    assert cache.lengths.tolist() == [0, 0]
    seq = torch.randint(0, 128, (1, 10))
    out = torch.cat(
        [
            tiny_model(seq[:, :4], kv_cache=cache, slots=[1]),
            tiny_model(seq[:, 4:], kv_cache=cache, slots=[1]),
        ],
        1,
    )
    torch.testing.assert_close(out, tiny_model(seq), **TOL)
    cache.reset()
    assert cache.lengths.tolist() == [0, 0]


def test_reduced_precision_cache_stays_close(tiny_model):
    seq = torch.randint(0, 128, (1, 12))
    cache = KVCache.for_model(tiny_model.config, num_slots=1, max_len=12, dtype=torch.bfloat16)
    out = torch.cat([tiny_model(seq[:, :8], kv_cache=cache), tiny_model(seq[:, 8:], kv_cache=cache)], 1)
    full = tiny_model(seq)
    assert (out - full).abs().max() < 0.05 * full.abs().max()
    assert cache.k.dtype == torch.bfloat16


def test_decode_past_max_seq_len_grows_rotary():
    model = randomized(GPT(tiny_config(max_seq_len=8)))
    seq = torch.randint(0, 128, (1, 14))
    cache = new_cache(model, num_slots=1, max_len=14)
    out = [model(seq[:, :6], kv_cache=cache)] + [
        model(seq[:, t : t + 1], kv_cache=cache) for t in range(6, 14)
    ]
    torch.testing.assert_close(torch.cat(out, 1), model(seq), **TOL)


@pytest.mark.parametrize(
    "slots, message",
    [
        ([0, 0], "repeat a slot"),
        ([0, 4], "out of range: this cache has 4 slots"),
        ([1], "got 1 slots for a batch of 2 rows"),
    ],
)
def test_bad_slots(tiny_model, slots, message):
    cache = new_cache(tiny_model)
    with pytest.raises(KVCacheError, match=message):
        tiny_model(torch.zeros(2, 1, dtype=torch.long), kv_cache=cache, slots=slots)
    assert cache.lengths.tolist() == [0, 0, 0, 0]


def test_full_slot_is_refused_without_side_effects(tiny_model):
    cache = new_cache(tiny_model, num_slots=2, max_len=8)
    tiny_model(torch.zeros(1, 6, dtype=torch.long), kv_cache=cache, slots=[1])
    with pytest.raises(KVCacheError, match=r"slots \[1\] would exceed the cache length 8"):
        tiny_model(torch.zeros(1, 3, dtype=torch.long), kv_cache=cache, slots=[1])
    assert cache.lengths.tolist() == [0, 6]
    with pytest.raises(KVCacheError, match="batch of 3 rows but the cache has only 2 slots"):
        tiny_model(torch.zeros(3, 1, dtype=torch.long), kv_cache=cache)
    with pytest.raises(KVCacheError, match="needs at least one token"):
        tiny_model(torch.zeros(1, 0, dtype=torch.long), kv_cache=cache)
    with pytest.raises(KVCacheError, match="slots were given without a kv_cache"):
        tiny_model(torch.zeros(1, 1, dtype=torch.long), slots=[0])


def test_bytes_needed_matches_allocation(tiny_model):
    cache = KVCache.for_model(tiny_model.config, num_slots=3, max_len=32, dtype=torch.bfloat16)
    expected = KVCache.bytes_needed(tiny_model.config, 3, 32, dtype=torch.bfloat16)
    assert expected == cache.k.numel() * 2 + cache.v.numel() * 2 == 2 * 2 * 3 * 2 * 32 * 16 * 2
