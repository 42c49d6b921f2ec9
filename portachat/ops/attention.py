"""Attention behind one function, so model code never names a vendor.

SDPA is the default everywhere: torch dispatches it to flash / memory-efficient / math
kernels per device. Where the device layer selected a vendor's fused kernel and the call fits it
(portachat.device.fused_attention holds that choice and the vendor call; `PORTACHAT_ATTENTION=sdpa`
turns it off), that kernel runs instead.
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
