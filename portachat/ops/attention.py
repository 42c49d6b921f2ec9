"""Attention behind one function, so model code never names a vendor.

SDPA is the default everywhere: torch dispatches it to flash / memory-efficient / math
kernels per device. Where the device layer selected a vendor's fused kernel and the call fits it
(portachat.device.fused_attention holds that choice and the vendor call; `PORTACHAT_ATTENTION=sdpa`
turns it off), that kernel runs instead.

Packed rows (several sequences back to back in one row, positions restarting at each) attend only
within their own sequence: `packed_attention_mask(positions)` builds their mask once per forward, in
the form the device layer chose (policy.decide_packed_attention): a flex_attention `BlockMask` over
per-token document ids where compiled flex runs (blocks across sequences are skipped, not computed
and masked), else the dense block-diagonal causal mask of `packed_causal_mask` (a vendor kernel gets
it as its own convention). `attention()` runs whichever it is given, so model code never builds a
kernel's mask.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from portachat.device.device import Device
from portachat.device.fast_paths import Verdict, check
from portachat.device.fused_attention import fused_applies, kernels_for, npu_fusion
from portachat.ops.fast_path import enabled_in_trace

AttentionMask = torch.Tensor | BlockMask  # a boolean mask (True = attend) or flex_attention's block mask
_compiled_flex = []  # torch.compile(flex_attention), made on first use: the fused kernel exists only compiled


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    is_causal: bool,
    attn_mask: AttentionMask | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention on [B, H, T, D] tensors; k/v may have fewer (grouped) heads.

    `attn_mask` is a boolean mask (True = attend) broadcastable to [B, H, Tq, Tk], or a flex_attention
    `BlockMask` (from `packed_attention_mask`); when given, `is_causal` must be False (the mask already
    encodes causality).
    """
    if isinstance(attn_mask, BlockMask):
        return _flex(q.device.type)(q, k, v, block_mask=attn_mask, enable_gqa=k.size(1) != q.size(1))
    if fused_applies(q, attn_mask) and enabled_in_trace("npu_fusion_attention", q.device, check_npu_fusion, False):
        return npu_fusion(q, k, v, is_causal=is_causal, attn_mask=attn_mask)
    return sdpa(q, k, v, is_causal=is_causal, attn_mask=attn_mask)


def sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool, attn_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """torch's SDPA on [B, H, T, D] with grouped kv heads taken the way the device layer chose for the
    tensors' device type (policy.decide_gqa): SDPA's enable_gqa, or the kv heads repeated to the query
    heads first where the backend lacks it."""
    groups = q.size(1) // k.size(1)
    if groups == 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
    if kernels_for(q.device.type).gqa == "repeat_kv":
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, enable_gqa=True)


def _flex(device_type: str):
    """flex_attention compiled where the device layer chose it; inside a model torch.compile is already
    tracing, the plain function (the outer compile fuses it; compiling again within would not nest).
    Elsewhere (a BlockMask built by hand, as tests do on a CPU) the eager reference implementation."""
    if kernels_for(device_type).packed != "flex" or torch.compiler.is_compiling():
        return flex_attention
    if not _compiled_flex:
        _compiled_flex.append(torch.compile(flex_attention))
    return _compiled_flex[0]


def packed_attention_mask(positions: torch.Tensor) -> AttentionMask:
    """The mask of packed rows in the form the device layer chose for them: a `BlockMask` over document
    ids for compiled flex_attention, else `packed_causal_mask(positions)`. Built once per forward."""
    # Inside a compiled model's first trace the check cannot run: the device's choice stands until it has.
    if kernels_for(positions.device.type).packed == "flex" and enabled_in_trace(
            "flex_attention", positions.device, check_flex, True):
        return document_block_mask(document_ids(positions))
    return packed_causal_mask(positions)


def check_npu_fusion(dev: Device) -> Verdict:
    """Ascend's fused attention beside SDPA (the fast path's self-test): causal, and with packed rows' mask."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 48, 64, generator=g).to(dev.torch_device, dev.dtype) for _ in range(3))
    positions = torch.tensor([list(range(20)) + list(range(28))] * 2, device=dev.torch_device)
    mask = packed_causal_mask(positions)

    def sdpa(**kw) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, **kw)

    return check("npu_fusion_attention",
                 lambda: [npu_fusion(q, k, v, is_causal=True), npu_fusion(q, k, v, is_causal=False, attn_mask=mask)],
                 lambda: [sdpa(is_causal=True), sdpa(attn_mask=mask)], dev.dtype)  # fmt: skip


def check_flex(dev: Device) -> Verdict:
    """Compiled flex_attention with the document block mask beside SDPA with the dense mask (the fast path's
    self-test): two rows packing sequences of different lengths, grouped-query heads."""
    g = torch.Generator().manual_seed(0)
    positions = torch.tensor([list(range(100)) + list(range(156)), list(range(200)) + list(range(56))])
    q, k, v = (torch.randn(2, h, 256, 64, generator=g).to(dev.torch_device, dev.dtype) for h in (4, 2, 2))
    positions = positions.to(dev.torch_device)
    block = document_block_mask(document_ids(positions))
    compiled = torch.compile(flex_attention)
    return check("flex_attention", lambda: compiled(q, k, v, block_mask=block, enable_gqa=True),
                 lambda: attention(q, k, v, is_causal=False, attn_mask=packed_causal_mask(positions)), dev.dtype)


def document_ids(positions: torch.Tensor) -> torch.Tensor:
    """Per-token sequence numbers [B, T] (1, 2, ... along each row) for per-token positions [B, T] that
    restart (do not grow) where a new sequence begins. Padding after a row's last sequence continues
    its positions, so it joins that sequence."""
    if positions.dim() != 2:
        raise ValueError(f"positions must be [batch, time], got shape {tuple(positions.shape)}")
    starts = torch.ones_like(positions, dtype=torch.bool)
    starts[:, 1:] = positions[:, 1:] <= positions[:, :-1]
    return starts.cumsum(dim=1)


def document_block_mask(documents: torch.Tensor) -> BlockMask:
    """flex_attention's block mask for document ids [B, T]: a token attends to itself and the tokens
    before it in its own document only (the same rule as `packed_causal_mask`)."""

    def same_document_causal(b: torch.Tensor, _h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return (documents[b, q] == documents[b, kv]) & (q >= kv)

    B, T = documents.shape
    return create_block_mask(same_document_causal, B, None, T, T, device=documents.device)


def packed_causal_mask(positions: torch.Tensor) -> torch.Tensor:
    """The attention mask of packed rows: boolean [B, 1, T, T], True = attend, for per-token positions
    [B, T] that restart (do not grow) where a new sequence begins. A token attends to itself and the
    tokens before it in its own sequence only; padding after a row's last sequence continues its
    positions, so it joins that sequence and, coming last, is never attended to by a real token."""
    segment = document_ids(positions)
    T = positions.size(1)
    causal = torch.ones(T, T, dtype=torch.bool, device=positions.device).tril()
    return (segment[:, :, None] == segment[:, None, :]).logical_and_(causal)[:, None]
