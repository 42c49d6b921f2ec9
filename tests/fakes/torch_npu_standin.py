"""A stand-in `torch_npu` for tests: Ascend's kernels as torch_npu's API reference documents them, on CPU
tensors, and deliberately wrong variants (a wrong layout or convention, a crash) that the self-test must
reject. `install(monkeypatch, module)` puts one in sys.modules where device/npu_kernels.py finds it."""

from __future__ import annotations

import math
import sys
import types

import torch
import torch.nn.functional as F

VERSION = "2.9.0.standin"


def npu_rms_norm(x, gamma, epsilon=1e-6):
    """(y, rstd): y = x * rsqrt(mean(x^2) + eps) * gamma, computed in fp32, returned in x's dtype."""
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + epsilon)
    return (xf * rstd * gamma.float()).to(x.dtype), rstd


def npu_rotary_mul(x, r1, r2, rotary_mode="half"):
    """half: r1 * x + r2 * cat(-x2, x1); interleave: the same on (even, odd) pairs. 4-D tensors only."""
    if x.dim() != 4 or r1.dim() != 4 or r2.dim() != 4:
        raise RuntimeError("npu_rotary_mul: x, r1 and r2 must be 4-D")
    if rotary_mode == "half":
        x1, x2 = x.chunk(2, dim=-1)
        rotated = torch.cat((-x2, x1), dim=-1)
    else:
        rotated = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    return r1 * x + r2 * rotated


def npu_swiglu(x, dim=-1):
    a, b = x.chunk(2, dim=dim)
    return F.silu(a) * b


def _attend(q, k, v, masked_out, scale):
    """q [B, N, Sq, D], k/v [B, N_kv, Skv, D], masked_out broadcastable bool (True = masked) or None."""
    groups = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    if masked_out is not None:
        scores = scores.masked_fill(masked_out, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return (probs @ v.float()).to(q.dtype), torch.logsumexp(scores, dim=-1, keepdim=True)


def _causal(sq: int, skv: int, sparse_mode: int, mask, device):
    if sparse_mode == 2:  # leftUpCausal: row i sees columns 0..i
        return torch.ones(sq, skv, dtype=torch.bool, device=device).triu(1)
    if sparse_mode == 3:  # rightDownCausal: the last query sees every key
        return torch.ones(sq, skv, dtype=torch.bool, device=device).triu(skv - sq + 1)
    return mask


def npu_fusion_attention(query, key, value, head_num, input_layout, pse=None, padding_mask=None, atten_mask=None,
                         scale=1.0, keep_prob=1.0, pre_tockens=2147483647, next_tockens=2147483647, inner_precise=0,
                         prefix=None, sparse_mode=0, **_):  # fmt: skip
    if input_layout != "BNSD":
        raise RuntimeError("stand-in: only BNSD")
    mask = _causal(query.size(2), key.size(2), sparse_mode, atten_mask, query.device)
    out, lse = _attend(query, key, value, mask, scale)
    return out, lse, lse, None, 0, 0, 0


def npu_fused_infer_attention_score(query, key, value, *, pse_shift=None, atten_mask=None, actual_seq_lengths=None,
                                    actual_seq_lengths_kv=None, num_heads=1, scale=1.0, pre_tokens=2147483647,
                                    next_tokens=2147483647, input_layout="BSH", num_key_value_heads=0,
                                    sparse_mode=0, **_):  # fmt: skip
    if input_layout == "BSND":
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    elif input_layout == "BNSD":
        q, k, v = query, key, value
    else:
        raise RuntimeError(f"stand-in: layout {input_layout} not implemented")
    if k.size(1) != (num_key_value_heads or num_heads) or q.size(1) != num_heads:
        raise RuntimeError("npu_fused_infer_attention_score: head counts do not match the tensors")
    mask = _causal(q.size(2), k.size(2), sparse_mode, atten_mask, q.device)
    out, lse = _attend(q, k, v, mask, scale)
    return (out.transpose(1, 2) if input_layout == "BSND" else out), lse


def _npu_reshape_and_cache(key, value, key_cache, value_cache, slot_indices):
    """key/value [N, H_kv, D] into caches [num_blocks, block_size, H_kv, D] at flat slots, in place."""
    slots = slot_indices.long()
    key_cache.view(-1, *key_cache.shape[2:])[slots] = key.to(key_cache.dtype)
    value_cache.view(-1, *value_cache.shape[2:])[slots] = value.to(value_cache.dtype)


def _npu_paged_attention(query, key_cache, value_cache, num_kv_heads, num_heads, scale_value, block_table,
                         context_lens, out):  # fmt: skip
    """One query per sequence over its first context_lens[b] cached tokens, read through its block table."""
    if context_lens.device.type != "cpu":
        raise RuntimeError("_npu_paged_attention reads context_lens on the host")
    block_size = key_cache.size(1)
    for b, length in enumerate(context_lens.tolist()):
        blocks = block_table[b, : math.ceil(length / block_size)].long()
        keys = key_cache[blocks].reshape(-1, num_kv_heads, key_cache.size(-1))[:length]
        values = value_cache[blocks].reshape(-1, num_kv_heads, value_cache.size(-1))[:length]
        q = query[b][None, :, None]  # [1, H, 1, D]
        o, _ = _attend(q, keys.transpose(0, 1)[None], values.transpose(0, 1)[None], None, scale_value)
        out[b] = o[0, :, 0]


def npu_top_k_top_p(logits, p, k):
    """aclnnApplyTopKTopP: sort ascending; below the k-th largest -> -inf; softmax; cumulative sum from the
    smallest; where it is <= 1 - p -> -inf (the largest always stays); back in the original order."""
    values, order = torch.sort(logits, dim=-1, stable=True)
    V = logits.size(-1)
    kth = values.gather(1, (V - k.long())[:, None])
    values = values.masked_fill(values < kth, float("-inf"))
    cumulative = torch.cumsum(torch.softmax(values.float(), dim=-1), dim=-1)
    drop = cumulative <= (1 - p.float())[:, None]
    drop[:, -1] = False
    values = values.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, values)


DOCUMENTED = {f.__name__: f for f in (npu_rms_norm, npu_rotary_mul, npu_swiglu, npu_fusion_attention,
                                      npu_fused_infer_attention_score, _npu_reshape_and_cache, _npu_paged_attention,
                                      npu_top_k_top_p)}  # fmt: skip


# --- wrong stand-ins: what a broken kernel, a layout mix-up or an older library would do ----------------


def _crash(*_a, **_k):
    raise RuntimeError("EZ9999: the AI core raised an exception (stand-in crash)")


def _rms_norm_one_plus_gamma(x, gamma, epsilon=1e-6):  # Gemma's convention, not Qwen's / Llama's
    return npu_rms_norm(x, 1 + gamma, epsilon)


def _rotary_interleaved(x, r1, r2, rotary_mode="half"):  # the other pairing convention
    return npu_rotary_mul(x, r1, r2, rotary_mode="interleave")


def _swiglu_halves_swapped(x, dim=-1):
    a, b = x.chunk(2, dim=dim)
    return F.silu(b) * a


def _reshape_and_cache_head_major(key, value, key_cache, value_cache, slot_indices):
    """Writes as if the caches were [num_blocks, H_kv, block_size, D] (a layout mix-up)."""
    for cache, src in ((key_cache, key), (value_cache, value)):
        nb, bs, h, d = cache.shape
        view = cache.view(nb, h, bs, d)
        for i, slot in enumerate(slot_indices.long().tolist()):
            view[slot // bs, :, slot % bs] = src[i].to(cache.dtype)


def _paged_attention_ignoring_length(query, key_cache, value_cache, num_kv_heads, num_heads, scale_value,
                                     block_table, context_lens, out):  # fmt: skip
    """Attends over whole blocks (the padding of the last block included)."""
    full = context_lens.clone()
    full[:] = ((context_lens + key_cache.size(1) - 1) // key_cache.size(1)) * key_cache.size(1)
    _npu_paged_attention(query, key_cache, value_cache, num_kv_heads, num_heads, scale_value, block_table, full, out)


def _top_k_top_p_ignoring_p(logits, p, k):
    return npu_top_k_top_p(logits, torch.ones_like(p), k)


def _fused_infer_attention_left_up(query, key, value, **kw):
    """Reads sparse_mode 3 as 2 (causal from the top-left corner): wrong for a chunk after its cache."""
    if kw.get("sparse_mode") == 3:
        kw["sparse_mode"] = 2
    return npu_fused_infer_attention_score(query, key, value, **kw)


def _fusion_attention_sdpa_mask_convention(query, key, value, head_num, input_layout, atten_mask=None, **kw):
    """Reads atten_mask as SDPA does (True = attend): the inverse of Ascend's documented convention."""
    flipped = None if atten_mask is None else ~atten_mask
    return npu_fusion_attention(query, key, value, head_num, input_layout, atten_mask=flipped, **kw)


WRONG = {
    "npu_fusion_attention": _fusion_attention_sdpa_mask_convention,
    "npu_rms_norm": _rms_norm_one_plus_gamma,
    "npu_rotary_mul": _rotary_interleaved,
    "npu_swiglu": _swiglu_halves_swapped,
    "_npu_reshape_and_cache": _reshape_and_cache_head_major,
    "_npu_paged_attention": _paged_attention_ignoring_length,
    "npu_top_k_top_p": _top_k_top_p_ignoring_p,
    "npu_fused_infer_attention_score": _fused_infer_attention_left_up,
}


def module(overrides: dict | None = None) -> types.ModuleType:
    """A torch_npu with the documented kernels, some replaced by `overrides` (name -> function)."""
    mod = types.ModuleType("torch_npu")
    mod.__version__ = VERSION
    for name, fn in {**DOCUMENTED, **(overrides or {})}.items():
        setattr(mod, name, fn)
    return mod


def wrong(name: str) -> types.ModuleType:
    """torch_npu with kernel `name` computing the wrong thing."""
    return module({name: WRONG[name]})


def crashing(name: str) -> types.ModuleType:
    """torch_npu whose kernel `name` raises, as a kernel the SoC lacks does."""
    return module({name: _crash})


def install(monkeypatch, mod: types.ModuleType) -> types.ModuleType:
    monkeypatch.setitem(sys.modules, "torch_npu", mod)
    return mod
