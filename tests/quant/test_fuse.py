"""Fused quantized products (q/k/v, gate/up): the parts' outputs side by side, no extra memory."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from portachat.quant import Int4Linear, Int8Linear
from portachat.quant.fuse import fuse_rows, stack_rows


def _linears(rows: list[int], cols: int, bias: bool = False) -> list[nn.Linear]:
    torch.manual_seed(0)
    return [nn.Linear(cols, n, bias=bias) for n in rows]


def _quantized(mode: str, linears: list[nn.Linear]) -> list[nn.Module]:
    if mode == "int8":
        return [Int8Linear.from_linear(m, torch.bfloat16) for m in linears]
    return [Int4Linear.from_linear(m, 32, torch.bfloat16) for m in linears]


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_fused_product_equals_the_parts_side_by_side(mode):
    # Every part but the last a whole number of PyTorch's int4 packing blocks (64 rows on AVX-512)
    parts = _quantized(mode, _linears([128, 64, 32], 64, bias=True))
    x = torch.randn(3, 64).bfloat16()
    want = torch.cat([m(x) - m.bias.to(x.dtype) for m in parts], dim=-1)  # the fused product is bias-free
    fused = fuse_rows(parts)
    assert fused is not None
    assert torch.allclose(fused(x).float(), want.float(), atol=1e-2, rtol=1e-2)
    # the parts still compute what they did, from views of the fused codes (no second copy)
    codes = "qweight" if mode == "int8" else "packed"
    storages = {getattr(m, codes).untyped_storage().data_ptr() for m in parts}
    assert storages == {getattr(fused, codes).untyped_storage().data_ptr()}
    assert torch.allclose(torch.cat([m(x) - m.bias.to(x.dtype) for m in parts], dim=-1).float(), want.float())


def test_mixed_kinds_are_not_fused():
    linears = _linears([64, 64], 64)
    mixed = [
        Int8Linear.from_linear(linears[0], torch.bfloat16),
        Int4Linear.from_linear(linears[1], 32, torch.bfloat16),
    ]
    assert fuse_rows(mixed) is None
    assert fuse_rows([Int8Linear.from_linear(linears[0], torch.bfloat16), linears[1]]) is None
    groups = [
        Int4Linear.from_linear(linears[0], 32, torch.bfloat16),
        Int4Linear.from_linear(linears[1], 64, torch.bfloat16),
    ]
    assert fuse_rows(groups) is None  # one kernel call needs one group size


def test_stacking_stacked_weights_again_reuses_their_memory():
    """An engine re-fusing weights that were refreshed in place (RL) gets the same stack back: no copy."""
    parts = _linears([32, 16, 16], 24)
    want = torch.cat([m.weight.detach() for m in parts])
    stacked = stack_rows(parts, "weight")
    torch.testing.assert_close(stacked, want, rtol=0, atol=0)
    with torch.no_grad():
        parts[1].weight.add_(1.0)  # an in-place refresh through one module's view
    again = stack_rows(parts, "weight")
    assert again.data_ptr() == stacked.data_ptr() and again.shape == stacked.shape
    assert torch.equal(again[32:48], want[32:48] + 1.0) and torch.equal(again[:32], want[:32])
    fresh = _linears([32, 16, 16], 24)  # separate tensors: a new stack, the modules' weights its views
    before = [m.weight.data_ptr() for m in fresh]
    stack = stack_rows(fresh, "weight")
    assert stack.data_ptr() not in before and fresh[1].weight.data_ptr() == stack[32:].data_ptr()
