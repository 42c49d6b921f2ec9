"""int8/fp8 KV storage: quantization error bounds, byte counts, and paged attention over a quantized
cache against the same attention over the float cache it came from."""

from __future__ import annotations

import pytest
import torch

from portachat.ops import kv_quant
from portachat.ops.kv_quant import QuantizedKV
from portachat.ops.paged_attention import decode_attention, prefill_attention, write_kv


def test_int8_round_trip_error_is_at_most_half_a_step_per_token_and_head():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, 64, generator=g) * torch.tensor([0.01, 1.0, 300.0])[None, :, None]  # scales differ by head
    values, scale = kv_quant.quantize(x, torch.int8)
    assert values.dtype == torch.int8 and scale.shape == (5, 3)
    assert values.abs().amax(dim=-1).eq(127).all()  # each vector's largest element uses the whole range
    err = (values.float() * scale[..., None] - x).abs()
    assert (err <= scale[..., None] / 2 + 1e-6 * x.abs()).all()


def test_zero_vectors_stay_zero():
    values, scale = kv_quant.quantize(torch.zeros(2, 1, 8), torch.int8)
    assert values.eq(0).all() and torch.isfinite(scale).all()


def test_fp8_round_trip_is_within_e4m3_precision():
    x = torch.randn(4, 2, 32, generator=torch.Generator().manual_seed(1)) * 50
    values, scale = kv_quant.quantize(x, torch.float8_e4m3fn)
    back = values.float() * scale[..., None]
    assert ((back - x).abs() <= x.abs() / 16 + scale[..., None] * 2**-6).all()  # 3 mantissa bits


def test_bytes_per_token_counts_the_scales():
    fp32 = kv_quant.bytes_per_token(30, 3, 64, torch.float32)
    bf16 = kv_quant.bytes_per_token(30, 3, 64, torch.bfloat16)
    int8 = kv_quant.bytes_per_token(30, 3, 64, torch.int8)
    assert fp32 == 2 * 30 * 3 * 64 * 4 and bf16 == fp32 // 2
    assert int8 == 2 * 30 * 3 * (64 + 4)  # one fp32 scale per token and kv head
    assert 1.85 < bf16 / int8 < 2 and 3.7 < fp32 / int8 < 4


def test_allocate_keeps_float_caches_plain_tensors():
    assert isinstance(kv_quant.allocate((2, 1, 8, 4), torch.float32, "cpu"), torch.Tensor)
    q = kv_quant.allocate((2, 1, 8, 4), torch.int8, "cpu")
    assert isinstance(q, QuantizedKV) and q.scale.shape == (2, 1, 8)
    layer = q[1]
    assert layer.data.shape == (1, 8, 4) and layer.data.data_ptr() == q.data[1].data_ptr()  # a view


def _caches(dtype: torch.dtype, slots: int, H_kv: int, D: int, k: torch.Tensor, v: torch.Tensor):
    kc, vc = kv_quant.allocate((H_kv, slots, D), dtype, "cpu"), kv_quant.allocate((H_kv, slots, D), dtype, "cpu")
    write_kv(kc, vc, torch.arange(slots), k, v)
    return kc, vc


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn])
def test_decode_and_prefill_attention_over_a_quantized_cache_match_the_float_cache(dtype):
    g = torch.Generator().manual_seed(2)
    B, H, H_kv, D, slots = 3, 4, 2, 16, 40
    k, v = torch.randn(slots, H_kv, D, generator=g), torch.randn(slots, H_kv, D, generator=g)
    exact = _caches(torch.float32, slots, H_kv, D, k, v)
    quant = _caches(dtype, slots, H_kv, D, k, v)
    q = torch.randn(B, H, D, generator=g)
    slot_index = torch.randint(0, slots, (B, 12), generator=g)
    mask = (torch.arange(12)[None, :] < torch.tensor([12, 5, 9])[:, None])[:, None, None, :]
    want = decode_attention(q, *exact, slot_index, mask)
    got = decode_attention(q, *quant, slot_index, mask)
    tol = 0.02 if dtype == torch.int8 else 0.1  # int8: 1/254 of each vector's range; e4m3: 3 mantissa bits
    assert (got - want).abs().max() < tol
    assert (got - want).abs().max() > 0  # the quantized path really ran
    # A chunk that continues a sequence reads every key through the (dequantized) cache.
    chunk_q = torch.randn(5, H, D, generator=g)
    index = torch.arange(20)
    causal = torch.arange(20)[None, :] <= torch.arange(15, 20)[:, None]
    want = prefill_attention(chunk_q, None, None, *exact, index, causal)
    got = prefill_attention(chunk_q, None, None, *quant, index, causal)
    assert (got - want).abs().max() < tol


def test_quantized_decode_computes_in_fp32_on_a_cpu_for_bf16_queries():
    g = torch.Generator().manual_seed(3)
    k, v = torch.randn(8, 1, 8, generator=g), torch.randn(8, 1, 8, generator=g)
    kc, vc = _caches(torch.int8, 8, 1, 8, k, v)
    q = torch.randn(2, 2, 8, generator=g)
    slot_index = torch.arange(8).repeat(2, 1)
    out16 = decode_attention(q.bfloat16(), kc, vc, slot_index, None)
    assert out16.dtype == torch.bfloat16
    assert (out16.float() - decode_attention(q.bfloat16().float(), kc, vc, slot_index, None)).abs().max() < 1e-2
