"""Attention over a paged KV cache, for the inference engine.

The cache of one layer is a flat array of token slots [num_slots, H_kv, D]; a sequence's keys are
the slots its block table names. The portable path gathers those slots into a dense tensor and runs
SDPA (decode rows batched together with a padding mask; each prefill chunk on its own, causal).
Vendor fused kernels (flash-attn's block-table decode, torch_npu's incremental attention) would
plug in here, behind the same two functions, so the engine never names a vendor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def write_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Store new keys/values [N, H_kv, D] at their slots [N]."""
    k_cache.index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.index_copy_(0, slots, v.to(v_cache.dtype))


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_index: torch.Tensor,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """One query per sequence. q [B, H, D]; slot_index [B, L] (padding points at any valid slot);
    mask [B, 1, 1, L] bool (True = attend) or None when every row uses all L keys. Returns [B, H, D]."""
    B, L = slot_index.shape
    H, D = q.shape[1], q.shape[2]
    H_kv = k_cache.shape[1]
    flat = slot_index.reshape(-1)
    # index_select, not k_cache[slot_index]: advanced indexing is ~100x slower on CPU here.
    keys = k_cache.index_select(0, flat).view(B, L, H_kv, D).transpose(1, 2)  # [B, H_kv, L, D]
    values = v_cache.index_select(0, flat).view(B, L, H_kv, D).transpose(1, 2)
    # Plain matmuls rather than SDPA: with one query per row, CPU SDPA kernels spend far longer
    # in setup than in arithmetic. Query heads are grouped over their shared kv head.
    # On CPU these products are tiny and bf16 batched matmuls are slow: compute them in fp32.
    compute = torch.float32 if q.device.type == "cpu" else keys.dtype
    qg = q.view(B, H_kv, H // H_kv, D).to(compute)
    scores = torch.matmul(qg, keys.to(compute).transpose(2, 3)).float() * (D**-0.5)  # [B, H_kv, G, L]
    if mask is not None:
        scores = scores.masked_fill(~mask.view(B, 1, 1, L), float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(compute)
    return torch.matmul(probs, values.to(compute)).view(B, H, D).to(q.dtype)


def prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_index: torch.Tensor | None,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """A chunk of T new tokens of one sequence. q [T, H, D]; k/v [T, H_kv, D] are the chunk's own keys.
    With `slot_index` None the chunk starts the sequence: causal attention over its own keys. Else
    slot_index [L] are all L keys up to the chunk's end (already written) and mask [T, L] says which
    each query sees. Returns [T, H, D]."""
    qh = q.transpose(0, 1).unsqueeze(0)  # [1, H, T, D]
    if slot_index is None:
        keys, values = k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)
        out = F.scaled_dot_product_attention(
            qh, keys, values, is_causal=True, enable_gqa=k.size(1) != q.size(1)
        )
    else:
        keys = k_cache.index_select(0, slot_index).transpose(0, 1).unsqueeze(0).to(q.dtype)
        values = v_cache.index_select(0, slot_index).transpose(0, 1).unsqueeze(0).to(q.dtype)
        out = F.scaled_dot_product_attention(
            qh, keys, values, attn_mask=mask, enable_gqa=keys.size(1) != q.size(1)
        )
    return out.squeeze(0).transpose(0, 1)
