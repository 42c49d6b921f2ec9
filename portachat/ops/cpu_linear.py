"""Pre-packed linear layers for CPU inference.

A plain `F.linear` on CPU hands oneDNN (bf16) or MKL (fp32) a weight in PyTorch's row-major layout,
and the library re-lays it out into its blocked format on every call: for a decode step, where each
weight is read once for one token, that re-layout costs as much as the product itself (7x on
SmolLM2's 49152-wide output head in bf16). Packing each weight once when the engine starts removes
it. This is what inductor's "freezing" does for compiled CPU graphs, without compiling anything,
so it works for every batch shape. Off the CPU, `pack_linear` returns None and callers use the module.

Where a CPU has no packed bf16 kernel (no AVX512-BF16/AMX: oneDNN has none), `pack_linear` still
returns the product, unpacked: the engine's fused forward (one product for q/k/v, one for gate/up,
fewer small operations around them) decodes faster than the modules there too, at no memory cost.

Where portachat's own kernels build (device.cpu_kernels: a bandwidth-bound small-batch product that
reads the weight in place), they take the row counts they win: measured on a 2-core AVX2 EPYC over
SmolLM2's layer shapes, batch 1 to 32, against MKL's packed fp32, ATen's bf16 and int8 kernels.
fp32 then needs no packed copy at all (MKL's unpacked product takes the large batches).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from portachat.device.device import Device
from portachat.device.fast_paths import Verdict, check
from portachat.device.inference import host_memory
from portachat.i18n import _
from portachat.ops import cpu_kernels
from portachat.ops.fast_path import enabled


def _mkldnn_bf16() -> bool:
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def _mkl_fp32() -> bool:
    return bool(torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear"))


def _packing_built(dtype: torch.dtype) -> bool:
    return _mkldnn_bf16() if dtype == torch.bfloat16 else dtype == torch.float32 and _mkl_fp32()


def packing_available(device_type: str, dtype: torch.dtype) -> bool:
    """Whether weights of `dtype` are packed for oneDNN / MKL here: the library has the kernel, and the
    packed product agreed with F.linear on this CPU (check_packing; the verdict is cached)."""
    if device_type != "cpu" or not _packing_built(dtype):
        return False
    return enabled("cpu_packed_linear", "cpu", check_packing)


def check_packing(dev: Device | None = None) -> Verdict:
    """Packed products beside F.linear, on small shapes, for each dtype this CPU packs: fp32 (MKL, with an
    RMSNorm weight folded in, at the packed batch size and another) and bf16 (oneDNN)."""
    g = torch.Generator().manual_seed(0)
    w, bias, scale = torch.randn(48, 96, generator=g), torch.randn(48, generator=g), torch.rand(96, generator=g) + 0.5
    x1, x3 = torch.randn(1, 96, generator=g), torch.randn(3, 96, generator=g)
    verdicts = []
    if _packing_built(torch.float32):
        fp32 = _packed(w, bias, scale, 1)
        linear = torch.nn.functional.linear
        verdicts.append(check("cpu_packed_linear", lambda: [fp32(x1), fp32(x3)],
                              lambda: [linear(x1 * scale, w, bias), linear(x3 * scale, w, bias)], torch.float32))
    if _packing_built(torch.bfloat16):
        wb, xb = w.bfloat16(), x3.bfloat16()
        bf16 = _packed(wb, None, None, 3)
        verdicts.append(check("cpu_packed_linear", lambda: bf16(xb).float(), lambda: (xb.float() @ wb.float().T),
                              torch.bfloat16))
    if not verdicts:
        return Verdict("cpu_packed_linear", False, _("neither MKL's fp32 nor oneDNN's bf16 packed kernels are built"))
    return next((v for v in verdicts if not v.ok), verdicts[0])


def kernels_available(device_type: str) -> bool:
    """Whether portachat's own small-batch CPU kernels are built and on for this device."""
    return device_type == "cpu" and cpu_kernels.library() is not None


def fused_forward_available(device_type: str, dtype: torch.dtype) -> bool:
    """Whether `pack_linear` returns products for this device and dtype (packed or not)."""
    if device_type != "cpu":
        return False
    return packing_available(device_type, dtype) or dtype == torch.bfloat16 or (
        dtype == torch.float32 and kernels_available(device_type)
    )


# Rows of x up to which the own kernel runs (measured as above; at 32 rows fp32 is even with MKL).
# bf16 without oneDNN's kernels: up to 32 rows; more go to MKL's fp32 GEMM over the weight widened a
# slice at a time (1.2x faster at 64 rows, 1.9x at 512; ATen's own bf16 GEMM runs 5x slower than the
# kernel at 32 rows here). With oneDNN's packed bf16 (AVX512-BF16/AMX, not measured here) only the
# bandwidth-bound few rows. int8/int4 where the kernels multiply integers (cpu_kernels.
# integer_products): every row count, 64 rows a call (1.8-2.9x ATen's int8/int4 kernels from 1 to
# 256 rows); where they widen codes to fp32, ATen's int4 kernel wins from 2 rows on.
KERNEL_ROWS = {"fp32": 16, "bf16": 32, "int8": cpu_kernels.MAX_ROWS, "int4": 1}
ALL_ROWS = 1 << 62


def kernel_rows(kind: str, lib: object) -> int:
    """Rows of x up to which the own kernel (in library `lib`) runs the product for weights `kind`."""
    if kind in ("int8", "int4") and cpu_kernels.integer_products(lib):
        return ALL_ROWS
    return KERNEL_ROWS[kind]
WIDENED_SLICE = 1 << 22  # weight elements widened to fp32 at a time (16 MB): bounds the transient
# Beside oneDNN's packed bf16 (AVX512-BF16/AMX; measured on a 2-core Sapphire Rapids with SmolLM2):
# its products are 1.7x the kernel's speed at 4 rows and 5x at 32, but a whole step on the kernels (no
# Python around 30 layers) still wins up to 16 rows: decode at batch 8 1.5x, 16 1.2x, 32 0.9x (so
# 16); a 16-token prompt 1.2x slower, a 64-token one 2.3x (so not more for prompts either).
BF16_ROWS_BESIDE_ONEDNN = 4
BF16_STEP_ROWS_BESIDE_ONEDNN = 16


class RoutedLinear:
    """x -> the product: the own kernel for up to `rows` rows of x, `fallback` for more. `kernel` (a
    cpu_kernels.SmallBatchLinear) is public so a caller may fuse around it (the engine's decode step),
    up to `step_rows` rows (at most MAX_ROWS, one call): there it saves every operation around the products, which outweighs a
    kernel somewhat slower than `fallback` alone."""

    def __init__(self, kernel: cpu_kernels.SmallBatchLinear, rows: int, fallback: Callable,
                 step_rows: int | None = None) -> None:  # fmt: skip
        self.kernel, self.rows, self.fallback = kernel, rows, fallback
        self.step_rows = min(rows if step_rows is None else step_rows, cpu_kernels.MAX_ROWS)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel(x) if x.size(0) <= self.rows else self.fallback(x)


def _widened_linear(weight: torch.Tensor, bias: torch.Tensor | None,
                    in_scale: torch.Tensor | None) -> Callable[[torch.Tensor], torch.Tensor]:  # fmt: skip
    """F.linear(x * in_scale, weight, bias) for many rows of bf16: fp32 GEMMs over slices of the
    weight's rows widened to fp32, so the transient is WIDENED_SLICE elements, not the weight."""
    rows = max(1, WIDENED_SLICE // weight.size(1))
    bias = None if bias is None else bias.detach().float()
    scale = None if in_scale is None else in_scale.detach().float()

    def linear(x: torch.Tensor) -> torch.Tensor:
        xf = x.float() if scale is None else x.float() * scale
        y = torch.empty(x.size(0), weight.size(0), dtype=x.dtype)
        for start in range(0, weight.size(0), rows):
            part = slice(start, start + rows)
            b = None if bias is None else bias[part]
            y[:, part] = torch.nn.functional.linear(xf, weight[part].float(), b)
        return y

    return linear


def small_batch_product(fallback: Callable, kind: str, weight: torch.Tensor, n: int, k: int,
                        scale: torch.Tensor | None = None, zero: torch.Tensor | None = None, group: int = 0,
                        in_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> Callable:  # fmt: skip
    """`fallback` with the small batches it loses on routed to the own kernel (cpu_kernels'
    SmallBatchLinear over `weight` in layout `kind`), or `fallback` itself where the kernels are off
    or this device is not a CPU. `fallback` must compute the same product (x * in_scale, + bias).

    The two are compared once on a random row: int4 is read in PyTorch's own packed layout, which
    differs by CPU and a new PyTorch may change; where they disagree the fallback is all that runs."""
    lib = cpu_kernels.library() if host_memory(weight.device) else None
    if lib is None or (kind == "int4" and cpu_kernels.int4_packing_block() is None):
        return fallback
    small = cpu_kernels.SmallBatchLinear(lib, kind, weight, n, k, scale, zero, group, in_scale, bias)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(0))
    want, got = fallback(x).float(), small(x).float()
    if not torch.allclose(got, want, rtol=0.02, atol=0.02 * float(want.abs().max())):
        return fallback
    return RoutedLinear(small, kernel_rows(kind, lib), fallback)


# Packed copies' size per byte of weight. MKL's packed sgemm layout pads its panels: measured (RSS)
# 1.03x-1.5x the fp32 weight depending on the shape, 1.34x over whole depth-8 and depth-12 portachat
# models on an AVX2 EPYC. oneDNN's bf16 blocks are counted as the weight itself (not measured here).
PACKED_SIZE = {torch.float32: 1.34, torch.bfloat16: 1.0}


def packed_weight_bytes(device_type: str, dtype: torch.dtype, weight_bytes: int) -> int:
    """Memory the packed copies of `weight_bytes` of linear weights take beside the model's own
    weights (memory planning); 0 where this device and dtype pack nothing."""
    return int(weight_bytes * PACKED_SIZE[dtype]) if holds_packed_copy(device_type, dtype) else 0


# The fused CPU forward's step transient against the tensors counted per layer (serve_memory's
# step_activation_bytes): the peak resident size measured ~2x (fp32, depth 4-12, 256-1024-token
# steps: freed blocks stay with the allocator for the next layer, and MKL's GEMMs keep workspaces).
CPU_STEP_TRANSIENT_FACTOR = 2.0


def step_transient_factor(device_type: str | None) -> float:
    """Multiplier on a forward step's counted activations for memory planning on this device."""
    return CPU_STEP_TRANSIENT_FACTOR if device_type == "cpu" else 1.0


def holds_packed_copy(device_type: str, dtype: torch.dtype) -> bool:
    """Whether `pack_linear` keeps a packed copy of each weight: not where nothing packs, nor for
    fp32 beside the own kernels (they read the weight in place; MKL's unpacked product takes the
    large batches)."""
    if not packing_available(device_type, dtype):
        return False
    return not (dtype == torch.float32 and kernels_available(device_type))


def pack_linear(
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    in_scale: torch.Tensor | None = None,
    batch_hint: int = 1,
) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """A function x [N, in] -> [N, out] equal to F.linear(x * in_scale, weight, bias), with the weight
    packed once where a packed kernel exists (bf16 without one: unpacked); None where
    `fused_forward_available` says no (use the plain module then).

    `in_scale` [in] (an RMSNorm's weight) is folded into the packed copy, W diag(in_scale), so the
    packed product needs no extra operation. Only the packed copy is new memory: `weight` itself is
    what the MKL kernel falls back to for row counts other than `batch_hint`, unfolded."""
    if not fused_forward_available(weight.device.type, weight.dtype):
        return None
    weight = weight.detach()
    lib = cpu_kernels.library()
    kind = "bf16" if weight.dtype == torch.bfloat16 else "fp32"  # fused_forward_available allows no other
    small = None if lib is None else cpu_kernels.SmallBatchLinear(lib, kind, weight, *weight.shape,
                                                                  in_scale=in_scale, bias=bias)  # fmt: skip
    if small is not None and not holds_packed_copy("cpu", weight.dtype):
        if kind == "bf16":
            # In a whole step the kernel also takes 33-64 rows (products ~1.2x MKL's there, and the step
            # keeps fp32 activations between bf16 weights: closer to the fp32 forward).
            return RoutedLinear(small, KERNEL_ROWS[kind], _widened_linear(weight, bias, in_scale),
                                step_rows=cpu_kernels.MAX_ROWS)  # fmt: skip
        return RoutedLinear(small, KERNEL_ROWS[kind], _plain_linear(weight, bias, in_scale))
    if not packing_available(weight.device.type, weight.dtype):
        return _plain_linear(weight, bias, in_scale)
    packed = _packed(weight, bias, in_scale, batch_hint)
    if weight.dtype == torch.bfloat16 and small is not None:
        return RoutedLinear(small, BF16_ROWS_BESIDE_ONEDNN, packed, step_rows=BF16_STEP_ROWS_BESIDE_ONEDNN)
    return packed


def _packed(weight: torch.Tensor, bias: torch.Tensor | None, in_scale: torch.Tensor | None,
            batch_hint: int) -> Callable[[torch.Tensor], torch.Tensor]:  # fmt: skip
    """F.linear(x * in_scale, weight, bias) through the weight packed once (oneDNN bf16, MKL fp32)."""
    bias = None if bias is None else bias.detach().contiguous()
    folded = (
        weight if in_scale is None else (weight.float() * in_scale.detach().float()[None, :]).to(weight.dtype)
    )
    if weight.dtype == torch.bfloat16:
        packed_bf16 = torch.ops.mkldnn._reorder_linear_weight(folded.contiguous(), batch_hint)

        def linear_bf16(x: torch.Tensor) -> torch.Tensor:
            return torch.ops.mkldnn._linear_pointwise(x, packed_bf16, bias, "none", [], "")

        return linear_bf16
    packed = torch.ops.mkl._mkl_reorder_linear_weight(folded.contiguous(), batch_hint)
    # MKL's packed GEMM reads only the shape of its "origin" operand when the rows equal batch_hint:
    # a zero-stride stand-in, so the folded copy is not kept alive.
    shape_only = weight.new_zeros(1).expand(weight.shape)
    unpacked = _plain_linear(weight, bias, in_scale)

    def linear_fp32(x: torch.Tensor) -> torch.Tensor:
        if x.size(0) == batch_hint:
            return torch.ops.mkl._mkl_linear(x, packed, shape_only, bias, batch_hint)
        return unpacked(x)

    return linear_fp32


def _plain_linear(weight: torch.Tensor, bias: torch.Tensor | None, in_scale: torch.Tensor | None) -> Callable:
    """F.linear(x * in_scale, weight, bias) as it is: no copy of the weight (a folded one would be one)."""
    bias = None if bias is None else bias.detach()
    scale = None if in_scale is None else in_scale.detach()

    def linear(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x if scale is None else x * scale, weight, bias)

    return linear
