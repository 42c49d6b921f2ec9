"""Ascend's fused kernels, called as torch_npu's API reference documents them (the one place they are named).

Each is a candidate fast path with a portable reference in ops/ (ops/fast_ops.py for the layer math,
ops/paged_attention.py for the engine's attention, engine/sampler.py for top-k/top-p); ops/selftest.py
checks one against the other on the device before either is used (device/fast_paths.py). Semantics,
from the torch_npu API reference:

- npu_rms_norm(x, gamma, epsilon) -> (y, rstd): y = x * rsqrt(mean(x^2, -1) + eps) * gamma, in x's dtype.
- npu_rotary_mul(x, r1, r2) (4-D x, "half" mode): r1 * x + r2 * cat(-x2, x1), x1/x2 = halves of the last dim.
- npu_swiglu(x, dim=-1): a, b = chunk(x, 2, dim); silu(a) * b.
- npu_fused_infer_attention_score(q, k, v, ..., input_layout="BSND", num_heads, num_key_value_heads,
  scale, sparse_mode, atten_mask) -> (out, lse): masks mean True = masked out.
- _npu_reshape_and_cache(key, value, key_cache, value_cache, slot_indices): key/value [N, H_kv, D] into
  caches [num_blocks, block_size, H_kv, D] at flat slots (int32), in place.
- _npu_paged_attention(query, key_cache, value_cache, num_kv_heads, num_heads, scale_value, block_table,
  context_lens, out): one query per sequence, query/out [B, H, D], block_table [B, max_blocks] int32,
  context_lens int32 on the host.
- npu_top_k_top_p(logits, p, k): logits [B, V] with everything outside each row's top k[b] and nucleus
  p[b] set to -inf (k int32 [B], p [B]); Atlas A2/A3 only.
"""

from __future__ import annotations

import sys
from types import ModuleType

import torch

from portachat.device.fused_attention import compressed_causal_mask

# Which torch_npu function each candidate calls (ops/selftest.py and fast_path_choice name them so).
OPS = {
    "npu_rms_norm": "npu_rms_norm",
    "npu_rotary_mul": "npu_rotary_mul",
    "npu_swiglu": "npu_swiglu",
    "npu_fused_infer_attention_score": "npu_fused_infer_attention_score",
    "npu_paged_attention": "_npu_paged_attention",
    "npu_reshape_and_cache": "_npu_reshape_and_cache",
    "npu_top_k_top_p": "npu_top_k_top_p",
}
_RIGHT_DOWN_CAUSAL = 3  # sparse_mode: causal aligned to the bottom-right corner (a chunk after its cache)


def torch_npu() -> ModuleType | None:
    """torch_npu where it is loaded (it autoloads with torch on an Ascend machine), else None."""
    return sys.modules.get("torch_npu")


def has_op(candidate: str) -> bool:
    """Whether the loaded torch_npu exposes the function this candidate calls."""
    mod = torch_npu()
    return mod is not None and hasattr(mod, OPS.get(candidate, candidate))


def _op(candidate: str):
    mod = torch_npu()
    if mod is None:
        raise RuntimeError("torch_npu is not loaded")
    return getattr(mod, OPS[candidate])


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _op("npu_rms_norm")(x, weight.to(x.dtype), epsilon=eps)[0]


def rotary_mul(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, N, S, D] (or BSND / SBND), cos/sin broadcastable to it (11SD, 1S1D, ...), in x's dtype."""
    return _op("npu_rotary_mul")(x, cos.to(x.dtype), sin.to(x.dtype))


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [..., 2F] = [gate | up] -> silu(gate) * up [..., F]."""
    return _op("npu_swiglu")(gate_up, dim=-1)


def fused_infer_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool) -> torch.Tensor:
    """One sequence's prefill in BSND layout: q [1, T, H, D], k/v [1, L, H_kv, D] (L >= T: the chunk's
    queries are the last T positions). Returns [1, T, H, D]."""
    mask, sparse_mode = None, 0
    if causal:
        mask, sparse_mode = compressed_causal_mask(q.device), _RIGHT_DOWN_CAUSAL
    out = _op("npu_fused_infer_attention_score")(
        q, k, v, num_heads=q.size(2), num_key_value_heads=k.size(2), input_layout="BSND",
        scale=q.size(-1) ** -0.5, atten_mask=mask, sparse_mode=sparse_mode,
    )
    return out[0]


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                      slots: torch.Tensor) -> None:  # fmt: skip
    _op("npu_reshape_and_cache")(key, value, key_cache, value_cache, slots.to(torch.int32))


def paged_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                    block_table: torch.Tensor, context_lens: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """query [B, H, D]; caches [num_blocks, block_size, H_kv, D]; block_table [B, max_blocks]; context_lens
    [B] (kept on the host, as the kernel reads them there). Returns [B, H, D]."""
    out = torch.empty_like(query)
    _op("npu_paged_attention")(
        query=query, key_cache=key_cache, value_cache=value_cache, num_kv_heads=key_cache.size(2),
        num_heads=query.size(1), scale_value=query.size(-1) ** -0.5, block_table=block_table.to(torch.int32),
        context_lens=context_lens.to(device="cpu", dtype=torch.int32), out=out,
    )
    return out


def top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """logits [B, V] filtered per row; top_k int [B] (V for none), top_p [B] (1.0 for none)."""
    return _op("npu_top_k_top_p")(logits, top_p.to(logits.dtype), top_k.to(torch.int32))
