"""Vendor fused attention kernels, behind the device layer: which family runs (chosen by get_device()),
how packed rows' document-masked attention runs (policy.decide_packed_attention, also chosen by
get_device()) and the Ascend kernel itself (`torch_npu.npu_fusion_attention`, per torch_npu's API
reference). portachat.ops.attention asks this module; nothing else names a vendor kernel."""

from __future__ import annotations

import math
import sys

import torch

_backend = "sdpa"
_packed = "dense_mask"  # policy.PACKED_ATTENTION
_FUSION_DTYPES = (torch.float16, torch.bfloat16)
_CAUSAL_MASK_SIZE = 2048  # npu_fusion_attention's compressed causal masks are 2048 x 2048
_LEFT_UP_CAUSAL = 2  # sparse_mode: causal aligned to the top-left corner, like SDPA's is_causal
_causal_masks: dict[torch.device, torch.Tensor] = {}


def select_backend(name: str) -> None:
    """Called by get_device(): "sdpa" or "npu_fusion_attention"."""
    global _backend
    _backend = name


def current_backend() -> str:
    return _backend


def select_packed(name: str) -> None:
    """Called by get_device(): how packed rows attend (policy.PACKED_ATTENTION)."""
    global _packed
    _packed = name


def packed_choice() -> str:
    return _packed


def fused_applies(q: torch.Tensor, attn_mask: torch.Tensor | None) -> bool:
    """Whether this call goes to the selected vendor kernel rather than SDPA."""
    return _backend == "npu_fusion_attention" and fusion_eligible(q.device.type, q.dtype, q.size(-1), attn_mask)

def fusion_eligible(
    device_type: str, dtype: torch.dtype, head_dim: int, attn_mask: torch.Tensor | None
) -> bool:
    """npu_fusion_attention takes fp16/bf16 on NPU, head_dim a multiple of 16 up to 256, 2-D/4-D masks."""
    if device_type != "npu" or dtype not in _FUSION_DTYPES or head_dim % 16 or head_dim > 256:
        return False
    return attn_mask is None or attn_mask.dim() in (2, 4)


def compressed_causal_mask(device: torch.device) -> torch.Tensor:
    """The 2048 x 2048 upper triangle (True = masked out) Ascend's fused kernels read with a causal
    sparse_mode, made once per device."""
    mask = _causal_masks.get(device)
    if mask is None:
        ones = torch.ones(_CAUSAL_MASK_SIZE, _CAUSAL_MASK_SIZE, dtype=torch.bool, device=device)
        mask = _causal_masks[device] = torch.triu(ones, diagonal=1)
    return mask


def npu_fusion(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    is_causal: bool,
    attn_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Ascend fused attention in BNSD layout. Its masks mean True = masked out (the opposite of SDPA's)."""
    torch_npu = sys.modules.get("torch_npu")
    if torch_npu is None:
        import torch_npu  # noqa: F811  (only reached on an NPU, where it is already loaded)
    sparse_mode = 0
    mask = None
    if attn_mask is not None:
        mask = ~attn_mask if attn_mask.dtype == torch.bool else attn_mask == 0
    elif is_causal:
        mask = compressed_causal_mask(q.device)
        sparse_mode = _LEFT_UP_CAUSAL
    out = torch_npu.npu_fusion_attention(
        q,
        k,
        v,
        q.size(1),
        "BNSD",
        atten_mask=mask,
        scale=1.0 / math.sqrt(q.size(-1)),
        keep_prob=1.0,
        sparse_mode=sparse_mode,
    )
    return out[0]
