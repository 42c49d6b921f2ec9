"""Attention behind one function, so model code never names a vendor.

SDPA is the default everywhere: torch dispatches it to flash / memory-efficient / math
kernels per device. Where the device layer selected a vendor's fused kernel and the call fits it
(portachat.device.fused_attention holds that choice and the vendor call; `PORTACHAT_ATTENTION=sdpa`
turns it off), that kernel runs instead.

Packed rows (several sequences back to back in one row, positions restarting at each) attend only
within their own sequence: `packed_causal_mask(positions)` builds the block-diagonal causal mask
once per forward, in the form `attention()` takes (a vendor kernel gets it as its own convention),
so model code never builds a kernel's mask.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from portachat.device.fused_attention import fused_applies, npu_fusion


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    is_causal: bool,
    attn_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention on [B, H, T, D] tensors; k/v may have fewer (grouped) heads.

    `attn_mask` is a boolean mask (True = attend) broadcastable to [B, H, Tq, Tk]; when given,
    `is_causal` must be False (the mask already encodes causality).
    """
    if fused_applies(q, attn_mask):
        return npu_fusion(q, k, v, is_causal=is_causal, attn_mask=attn_mask)
    enable_gqa = k.size(1) != q.size(1)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, is_causal=is_causal, enable_gqa=enable_gqa
    )


def packed_causal_mask(positions: torch.Tensor) -> torch.Tensor:
    """The attention mask of packed rows: boolean [B, 1, T, T], True = attend, for per-token positions
    [B, T] that restart (do not grow) where a new sequence begins. A token attends to itself and the
    tokens before it in its own sequence only; padding after a row's last sequence continues its
    positions, so it joins that sequence and, coming last, is never attended to by a real token."""
    if positions.dim() != 2:
        raise ValueError(f"positions must be [batch, time], got shape {tuple(positions.shape)}")
    starts = torch.ones_like(positions, dtype=torch.bool)
    starts[:, 1:] = positions[:, 1:] <= positions[:, :-1]
    segment = starts.cumsum(dim=1)
    T = positions.size(1)
    causal = torch.ones(T, T, dtype=torch.bool, device=positions.device).tril()
    return (segment[:, :, None] == segment[:, None, :]).logical_and_(causal)[:, None]
