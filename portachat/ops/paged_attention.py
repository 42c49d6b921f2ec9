"""Attention over a paged KV cache, for the inference engine.

The cache of one layer is an array of token slots per kv head, [H_kv, num_slots, D] (head-major);
a sequence's keys are the slots its block table names. The portable path gathers those slots into
a dense tensor and multiplies: gathering along the slot axis of a head-major cache gives
[H_kv, rows, D] blocks that the batched products read as they are, with no transposed copy of the
keys each step. Decode rows are batched together with a padding mask; each prefill chunk runs on
its own through SDPA, causal, or Ascend's incremental-attention kernel where it passed its self-test.
Vendor kernels plug in here, behind the same functions, so the engine never names a vendor (Ascend's
decode and cache-write kernels in ops/npu_attention, which keeps the memory under this head-major view
slot-major where they passed their self-tests). A cache may also be quantized (int8/fp8 with per-token scales, see kv_quant): the functions
take either kind, quantize on write and dequantize in the gather.
"""

from __future__ import annotations

import torch

from portachat.device import npu_kernels
from portachat.device.device import Device
from portachat.device.fast_paths import Verdict, check
from portachat.device.inference import attention_compute_dtype
from portachat.ops import kv_quant
from portachat.ops.attention import sdpa
from portachat.ops.fast_path import enabled
from portachat.ops.kv_quant import KVTensor, QuantizedKV

_FUSED_DTYPES = (torch.float16, torch.bfloat16)  # what npu_fused_infer_attention_score takes


def write_kv(
    k_cache: KVTensor, v_cache: KVTensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Store new keys/values [N, H_kv, D] at their slots [N] of a [H_kv, num_slots, D] cache."""
    if isinstance(k_cache, QuantizedKV):
        kv_quant.write(k_cache, v_cache, slots, k, v)
        return
    k_cache.index_copy_(1, slots, _as(k.transpose(0, 1), k_cache.dtype))
    v_cache.index_copy_(1, slots, _as(v.transpose(0, 1), v_cache.dtype))


def _as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # A no-op .to() still costs a dispatch (~1 us): decode calls this ~10 times per layer.
    return x if x.dtype == dtype else x.to(dtype)


def decode_attention(
    q: torch.Tensor,
    k_cache: KVTensor,
    v_cache: KVTensor,
    slot_index: torch.Tensor,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """One query per sequence. q [B, H, D]; slot_index [B, L] (padding points at any valid slot);
    mask [B, 1, 1, L] bool (True = attend) or None when every row uses all L keys. Returns [B, H, D]."""
    B, L = slot_index.shape
    H, D = q.shape[1], q.shape[2]
    H_kv = k_cache.shape[0]
    flat = slot_index.reshape(-1)
    if isinstance(k_cache, QuantizedKV):
        return _decode_quantized(q, k_cache, v_cache, flat, mask, B, L)
    # index_select, not k_cache[:, slot_index]: advanced indexing is ~100x slower on CPU here.
    keys = k_cache.index_select(1, flat).view(H_kv, B, L, D)
    values = v_cache.index_select(1, flat).view(H_kv, B, L, D)
    # Plain matmuls rather than SDPA: with one query per row, CPU SDPA kernels spend far longer in
    # setup than in arithmetic. Query heads are grouped over their shared kv head; batch order is
    # (kv head, sequence), the gathered keys' own layout.
    qg = _as(q.reshape(B, H_kv, H // H_kv, D).transpose(0, 1), keys.dtype)  # [H_kv, B, G, D]
    scores = _as(torch.matmul(qg, keys.transpose(2, 3)), torch.float32) * (D**-0.5)  # [H_kv, B, G, L]
    if mask is not None:
        scores = scores.masked_fill(~mask.view(1, B, 1, L), float("-inf"))
    probs = _as(torch.softmax(scores, dim=-1), values.dtype)
    out = torch.matmul(probs, values)  # [H_kv, B, G, D]
    return _as(out.transpose(0, 1).reshape(B, H, D), q.dtype)


def prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: KVTensor,
    v_cache: KVTensor,
    slot_index: torch.Tensor | None,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """A chunk of T new tokens of one sequence. q [T, H, D]; k/v [T, H_kv, D] are the chunk's own keys.
    With `slot_index` None the chunk starts the sequence: causal attention over its own keys. Else
    slot_index [L] are all L keys up to the chunk's end (already written) and mask [T, L] says which
    each query sees. Returns [T, H, D]."""
    if q.dtype in _FUSED_DTYPES and q.size(-1) % 16 == 0 and enabled(
            "npu_fused_infer_attention_score", q.device, check_fused_infer_attention):  # fmt: skip
        return _fused_prefill(q, k, v, k_cache, v_cache, slot_index)
    return _sdpa_prefill(q, k, v, k_cache, v_cache, slot_index, mask)


def _sdpa_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: KVTensor, v_cache: KVTensor,
                  slot_index: torch.Tensor | None, mask: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
    """prefill_attention through SDPA (the portable path)."""
    qh = q.transpose(0, 1).unsqueeze(0)  # [1, H, T, D]
    if slot_index is None:
        keys, values = k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)
        out = sdpa(qh, keys.to(q.dtype), values.to(q.dtype), is_causal=True)
    else:
        keys, values = _gather(k_cache, slot_index, q.dtype), _gather(v_cache, slot_index, q.dtype)
        keys, values = keys.unsqueeze(0), values.unsqueeze(0)  # [1, H_kv, L, D]
        out = sdpa(qh, keys, values, is_causal=False, attn_mask=mask)
    return out.squeeze(0).transpose(0, 1)


def _fused_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: KVTensor, v_cache: KVTensor,
                   slot_index: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
    """prefill_attention by Ascend's incremental-attention kernel (BSND). The mask the runner gives a
    continued chunk is causal aligned to the chunk's end (queries start..end-1 over keys 0..end-1): the
    kernel's bottom-right causal mode, so the mask itself is not passed."""
    if slot_index is None:
        keys, values = k, v
    else:
        keys = _gather(k_cache, slot_index, q.dtype).transpose(0, 1)  # [L, H_kv, D]
        values = _gather(v_cache, slot_index, q.dtype).transpose(0, 1)
    out = npu_kernels.fused_infer_attention(q[None], _as(keys, q.dtype)[None], _as(values, q.dtype)[None], causal=True)
    return out[0]


def check_fused_infer_attention(dev: Device) -> Verdict:
    """The fused prefill's self-test: a first chunk (causal over itself) and a chunk of 5 tokens after 7
    cached ones, grouped-query heads, beside the SDPA path of prefill_attention."""
    g = torch.Generator().manual_seed(5)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dev.torch_device, dev.dtype)

    q1, k1, v1, q2 = randn(9, 4, 64), randn(9, 2, 64), randn(9, 2, 64), randn(5, 4, 64)
    cache_k, cache_v = randn(2, 12, 64), randn(2, 12, 64)
    index = torch.arange(12, device=dev.torch_device)
    seen = (torch.arange(12)[None] <= (7 + torch.arange(5))[:, None]).to(dev.torch_device)  # [T, L]
    chunk_k, chunk_v = cache_k[:, -5:].transpose(0, 1), cache_v[:, -5:].transpose(0, 1)

    def run(attend) -> list[torch.Tensor]:
        return [attend(q1, k1, v1, None, None, None, None), attend(q2, chunk_k, chunk_v, cache_k, cache_v, index, seen)]

    return check("npu_fused_infer_attention_score",
                 lambda: run(lambda q, k, v, kc, vc, i, _m: _fused_prefill(q, k, v, kc, vc, i)),
                 lambda: run(_sdpa_prefill), dev.dtype)  # fmt: skip


def _gather(cache: KVTensor, index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(cache, QuantizedKV):
        return kv_quant.gather(cache, index, dtype)
    return _as(cache.index_select(1, index), dtype)


def _decode_quantized(
    q: torch.Tensor, k_cache: QuantizedKV, v_cache: QuantizedKV, flat: torch.Tensor,
    mask: torch.Tensor | None, B: int, L: int,
) -> torch.Tensor:  # fmt: skip
    """decode_attention over an int8/fp8 cache. The keys and values multiply unscaled (converted
    exactly to the compute dtype) and the per-token scales go where they touch the fewest elements:
    q.(s k) = s (q.k) scales the scores, sum p (s v) = sum (p s) v scales the probabilities."""
    H, D = q.shape[1], q.shape[2]
    H_kv = k_cache.data.shape[0]
    # A CPU computes attention in fp32 whatever the weights (as kv_cache_dtype's float cache does).
    dtype = attention_compute_dtype(q.device, q.dtype)
    keys, k_scale = kv_quant.gather_raw(k_cache, flat, dtype)
    values, v_scale = kv_quant.gather_raw(v_cache, flat, dtype)
    qg = _as(q.reshape(B, H_kv, H // H_kv, D).transpose(0, 1), dtype)  # [H_kv, B, G, D]
    scores = _as(torch.matmul(qg, keys.view(H_kv, B, L, D).transpose(2, 3)), torch.float32)  # [H_kv, B, G, L]
    scores = scores * (k_scale.view(H_kv, B, 1, L) * (D**-0.5))
    if mask is not None:
        scores = scores.masked_fill(~mask.view(1, B, 1, L), float("-inf"))
    probs = _as(torch.softmax(scores, dim=-1) * v_scale.view(H_kv, B, 1, L), dtype)
    out = torch.matmul(probs, values.view(H_kv, B, L, D))  # [H_kv, B, G, D]
    return _as(out.transpose(0, 1).reshape(B, H, D), q.dtype)
