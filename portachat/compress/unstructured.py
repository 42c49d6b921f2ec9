"""Unstructured magnitude pruning, made permanent, with the sparsity it really reached.

`l1_unstructured` zeroes the given fraction of each block weight matrix with the smallest |w|, with
torch.nn.utils.prune's semantics (round(amount * numel) entries per tensor), and then removes the
mask so the zeros are plain values in a plain checkpoint. `two_four` keeps the 2 largest |w| of
every 4 consecutive inputs (NVIDIA's 2:4 semi-structured pattern, exactly 50%).

The embeddings, the output head and the norms are left dense, as Wanda and SparseGPT do: they are
few parameters and the most sensitive. A zero costs the same as any other number in a dense matmul,
so neither pattern makes a dense kernel faster or the file smaller; only sparse kernels turn 2:4
into speed (cuSPARSELt through torch.sparse.to_sparse_semi_structured on NVIDIA GPUs of compute
capability 8.0 and newer), which portachat's runtimes do not use yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn.utils import prune as torch_prune

from portachat.i18n import _
from portachat.model.gpt import GPT

PATTERNS = ("unstructured", "2:4")


@dataclass
class SparsityReport:
    pattern: str
    amount: float  # the fraction asked for
    zeros: int  # zeros in the pruned matrices after pruning
    total: int  # entries of the pruned matrices
    model_zeros: int  # zeros in every parameter of the model
    model_total: int
    per_tensor: dict[str, float] = field(default_factory=dict)  # name -> its sparsity

    @property
    def sparsity(self) -> float:
        return self.zeros / max(self.total, 1)

    @property
    def model_sparsity(self) -> float:
        return self.model_zeros / max(self.model_total, 1)

    def summary(self) -> str:
        return _("{pattern} sparsity: {zeros:,} of {total:,} block weights are zero ({sparsity:.2%}; {model:.2%} of "
                 "all parameters). Dense kernels do not run faster on zeros, and the file keeps its size; only "
                 "sparse kernels (2:4 on GPUs that have them) turn sparsity into speed.").format(
            pattern=self.pattern, zeros=self.zeros, total=self.total, sparsity=self.sparsity,
            model=self.model_sparsity)


def block_linears(model: GPT) -> list[tuple[str, nn.Linear]]:
    """The weight matrices pruning may zero: every linear layer inside the blocks."""
    return [(f"model.layers.{name}", m) for name, m in model.model.layers.named_modules() if isinstance(m, nn.Linear)]


def check_amount(amount: float) -> None:
    if isinstance(amount, bool) or not isinstance(amount, int | float) or not 0.0 < amount < 1.0:
        raise ValueError(_("--unstructured takes the fraction of weights to zero, between 0 and 1 (e.g. 0.2), "
                           "got {value}").format(value=repr(amount)))


def _two_four_mask(weight: torch.Tensor) -> torch.Tensor:
    if weight.size(1) % 4 != 0:
        raise ValueError(_("2:4 sparsity needs input sizes divisible by 4; {shape} is not").format(
            shape=tuple(weight.shape)))
    groups = weight.abs().reshape(weight.size(0), -1, 4)
    keep = torch.zeros_like(groups, dtype=torch.bool)
    keep.scatter_(-1, groups.topk(2, dim=-1).indices, True)
    return keep.reshape(weight.shape)


def _report(model: GPT, pattern: str, amount: float) -> SparsityReport:
    per_tensor, zeros, total = {}, 0, 0
    for name, linear in block_linears(model):
        z = int((linear.weight == 0).sum())
        per_tensor[name + ".weight"] = z / linear.weight.numel()
        zeros, total = zeros + z, total + linear.weight.numel()
    params = list({id(p): p for p in model.parameters()}.values())  # a tied table once
    return SparsityReport(pattern=pattern, amount=amount, zeros=zeros, total=total,
                          model_zeros=sum(int((p == 0).sum()) for p in params),
                          model_total=sum(p.numel() for p in params), per_tensor=per_tensor)


@torch.no_grad()
def sparsify_(model: GPT, amount: float = 0.5, pattern: str = "unstructured") -> SparsityReport:
    """Zero block weights of `model` in place (`pattern`: "unstructured" with `amount`, or "2:4") and
    report the sparsity reached."""
    if pattern not in PATTERNS:
        raise ValueError(_("sparsity pattern must be one of {patterns}, got {value}").format(
            patterns=", ".join(PATTERNS), value=repr(pattern)))
    if pattern == "2:4":
        linears = block_linears(model)
        masks = [_two_four_mask(m.weight) for _name, m in linears]  # all checked before any weight changes
        for (_name, linear), mask in zip(linears, masks, strict=True):
            linear.weight.mul_(mask)
        return _report(model, pattern, 0.5)
    check_amount(amount)
    for _name, linear in block_linears(model):
        with torch.enable_grad():  # prune's reparametrisation builds weight = weight_orig * mask
            torch_prune.l1_unstructured(linear, "weight", amount=amount)
        torch_prune.remove(linear, "weight")  # the zeros become the weight itself
    return _report(model, pattern, amount)
