"""One product for several that read the same input (q/k/v, gate/up): rows stacked.

At batch 1 each product is a kernel call plus its dispatch; the engine's fused CPU forward
(serve/engine/packed_forward.py) runs q/k/v as one product and gate/up as another. For int8 and
int4 weights the codes and scales are stacked by output row as they are: no requantization, so the
fused product returns exactly the parts' outputs side by side. The modules' own buffers become views
of the stacked ones, so fusing costs no memory.
"""

from __future__ import annotations

import torch
from torch import nn

from portachat.quant.int4 import Int4Linear
from portachat.quant.int8 import Int8Linear


def _stacked_already(parts: list[torch.Tensor]) -> torch.Tensor | None:
    """The tensor `parts` already are consecutive row blocks of (left by an earlier stack_rows), or None."""
    first = parts[0]
    if any(p.dtype != first.dtype or p.shape[1:] != first.shape[1:] or not p.is_contiguous() for p in parts):
        return None
    storage, rows = first.untyped_storage(), 0
    for p in parts:
        at = first.storage_offset() + rows * first[0].numel()
        if p.untyped_storage().data_ptr() != storage.data_ptr() or p.storage_offset() != at:
            return None
        rows += p.size(0)
    if first.storage_offset() + rows * first[0].numel() > storage.nbytes() // first.element_size():
        return None
    return first.detach().new_empty(0).set_(storage, first.storage_offset(), (rows, *first.shape[1:]))


def stack_rows(modules: list[nn.Module], name: str) -> torch.Tensor:
    """Tensor `name` (a weight or a buffer) of every module stacked along rows; each module's own
    becomes a view of the stack, so the stack is not a second copy. Each old tensor is released as
    soon as it is copied, which keeps the transient to one part."""
    parts = [getattr(m, name) for m in modules]
    already = _stacked_already(parts)
    if already is not None:  # fused before (an engine re-fusing weights refreshed in place): same memory
        return already
    stacked = parts[0].new_empty(sum(t.size(0) for t in parts), *parts[0].shape[1:])
    del parts
    start = 0
    for m in modules:
        old = getattr(m, name)
        rows = old.size(0)
        stacked[start : start + rows].copy_(old.detach())
        view = stacked[start : start + rows]
        setattr(m, name, nn.Parameter(view, requires_grad=False) if isinstance(old, nn.Parameter) else view)
        start += rows
    return stacked


def _fuse_int8(modules: list[Int8Linear]) -> Int8Linear:
    scale = torch.cat([m.scale for m in modules])  # [out]: a few KB, kept per module too
    return Int8Linear(stack_rows(modules, "qweight"), scale, modules[0].activation_dtype)


def _fuse_int4(modules: list[Int4Linear]) -> Int4Linear | None:
    if len({m.group_size for m in modules}) != 1:
        return None
    packed = stack_rows(modules, "packed")
    sz = torch.cat([m.scales_and_zeros for m in modules], dim=1)  # [in/group, out, 2]: small
    return Int4Linear.from_kernel_layout(packed, sz, modules[0].group_size, modules[0].activation_dtype,
                                         modules[0].in_features)  # fmt: skip


@torch.no_grad()
def fuse_rows(modules: list[nn.Module]) -> nn.Module | None:
    """A bias-free product equal to the modules' outputs (without their biases) concatenated, or None
    where they are not all int8, or all int4 with one group size, or where the stacked kernel layout
    does not reproduce the parts (checked once on a random input)."""
    if all(isinstance(m, Int8Linear) for m in modules):
        fused = _fuse_int8(modules)
    elif all(isinstance(m, Int4Linear) for m in modules):
        fused = _fuse_int4(modules)
    else:
        return None
    if fused is None:
        return None
    first = modules[0]
    x = torch.randn(2, first.in_features, generator=torch.Generator().manual_seed(0)).to(
        device=fused.scale.device if isinstance(fused, Int8Linear) else fused.packed.device,
        dtype=first.activation_dtype,
    )
    parts = torch.cat([m(x).float() - (0 if m.bias is None else m.bias.float()) for m in modules], dim=-1)
    # Same codes, same kernel: only the biases' bf16 rounding differs; a wrong layout is off by O(1).
    close = torch.allclose(fused(x).float(), parts, rtol=0.02, atol=0.02 * float(parts.abs().max()))
    return fused if close else None
