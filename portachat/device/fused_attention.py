"""Vendor fused attention kernels, behind the device layer. Per torch device type: which family runs,
how packed rows' document-masked attention runs (policy.decide_packed_attention) and how SDPA takes
grouped kv heads (policy.decide_gqa), set when get_device() builds that type's Device; and the Ascend
kernel itself (`torch_npu.npu_fusion_attention`, per torch_npu's API reference).
portachat.ops.attention asks this module; nothing else names a vendor kernel."""

from __future__ import annotations

import math
import sys
import threading
from dataclasses import dataclass

import torch

_FUSION_DTYPES = (torch.float16, torch.bfloat16)
_CAUSAL_MASK_SIZE = 2048  # npu_fusion_attention's compressed causal masks are 2048 x 2048
_LEFT_UP_CAUSAL = 2  # sparse_mode: causal aligned to the top-left corner, like SDPA's is_causal
_causal_masks: dict[torch.device, torch.Tensor] = {}


@dataclass(frozen=True)
class KernelChoice:
    """The attention kernels tensors of one device type run: the family (policy.ATTENTION_BACKENDS), how
    packed rows attend (policy.PACKED_ATTENTION) and how SDPA takes grouped kv heads ("native" | "repeat_kv")."""

    attention: str = "sdpa"
    packed: str = "dense_mask"
    gqa: str = "native"


# Before any Device of a type is built: what every device runs, except SDPA's enable_gqa on an NPU.
DEFAULT_CHOICES = {"npu": KernelChoice(gqa="repeat_kv")}
# Per torch device type, so that building the CPU device never changes what NPU or CUDA tensors run.
_choices: dict[str, KernelChoice] = {}
_lock = threading.Lock()


def use_kernels(device_type: str, choice: KernelChoice) -> KernelChoice:
    """Make `choice` what tensors of `device_type` run; returns the previous choice (to restore).
    get_device() calls it once, when it builds the Device of that type."""
    with _lock:
        previous = kernels_for(device_type)
        _choices[device_type] = choice
        return previous


def kernels_for(device_type: str) -> KernelChoice:
    """What tensors of `device_type` run (the ops ask this for every call)."""
    return _choices.get(device_type) or DEFAULT_CHOICES.get(device_type) or KernelChoice()


def fused_applies(q: torch.Tensor, attn_mask: torch.Tensor | None) -> bool:
    """Whether this call goes to the device type's vendor kernel rather than SDPA."""
    return (kernels_for(q.device.type).attention == "npu_fusion_attention"
            and fusion_eligible(q.device.type, q.dtype, q.size(-1), attn_mask))


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
    """Ascend fused attention in BNSD layout (k/v may have fewer heads: the kernel groups them itself). Its
    masks mean True = masked out (the opposite of SDPA's)."""
    torch_npu = sys.modules.get("torch_npu")
    if torch_npu is None:
        import torch_npu  # noqa: F811  deferred: a vendor module, only reached on an NPU (already loaded there)
    sparse_mode = 0
    mask = None
    if attn_mask is not None:
        mask = ~attn_mask if attn_mask.dtype == torch.bool else attn_mask == 0
    elif is_causal:
        mask = compressed_causal_mask(q.device)
        sparse_mode = _LEFT_UP_CAUSAL
    # The kernel reads BNSD as laid out in memory: the [B, T, H, D] -> [B, H, T, D] transposes the model
    # hands us are views, so they are made contiguous here (a no-op for contiguous inputs).
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
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
