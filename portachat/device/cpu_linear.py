"""Pre-packed linear layers for CPU inference.

A plain `F.linear` on CPU hands oneDNN (bf16) or MKL (fp32) a weight in PyTorch's row-major layout,
and the library re-lays it out into its blocked format on every call: for a decode step, where each
weight is read once for one token, that re-layout costs as much as the product itself (7x on
SmolLM2's 49152-wide output head in bf16). Packing each weight once when the engine starts removes
it. This is what inductor's "freezing" does for compiled CPU graphs, without compiling anything,
so it works for every batch shape. Off the CPU, `pack_linear` returns None and callers use the module.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def _mkldnn_bf16() -> bool:
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def _mkl_fp32() -> bool:
    return bool(torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear"))


def packing_available(device_type: str, dtype: torch.dtype) -> bool:
    if device_type != "cpu":
        return False
    if dtype == torch.bfloat16:
        return _mkldnn_bf16()
    if dtype == torch.float32:
        return _mkl_fp32()
    return False


def pack_linear(
    weight: torch.Tensor, bias: torch.Tensor | None = None, batch_hint: int = 1
) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """A function x [N, in] -> [N, out] equal to F.linear(x, weight, bias), with the weight packed
    once; None when this device/dtype has no packed kernel (use the plain module then)."""
    if not packing_available(weight.device.type, weight.dtype):
        return None
    weight = weight.detach().contiguous()
    bias = None if bias is None else bias.detach().contiguous()
    if weight.dtype == torch.bfloat16:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, batch_hint)

        def linear_bf16(x: torch.Tensor) -> torch.Tensor:
            return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

        return linear_bf16
    packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, batch_hint)

    def linear_fp32(x: torch.Tensor) -> torch.Tensor:
        # MKL's packed GEMM keeps the original weight alongside the packed one (for its fallback).
        return torch.ops.mkl._mkl_linear(x, packed, weight, bias, batch_hint)

    return linear_fp32
