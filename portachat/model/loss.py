"""The training loss: next-token cross-entropy on supervised positions only, a chunk at a time.

The output head's logits are the largest tensor of a small model's step: [tokens x vocabulary] in fp32
(2,049 x 49,152 x 4 bytes = 403 MB per row of SmolLM2). Here the head runs only on positions whose
target is supervised (target >= 0), and on at most `chunk` of them at once, so the fp32
[tokens x vocab] tensor never exists whole:
  - training a summed or mean loss through a plain linear head (every model's lm_head), each chunk's
    gradients are taken as soon as its logits exist (softmax minus one-hot, times the head), and the
    logits are freed: nothing of size vocab is kept for the backward and nothing is recomputed
    (`_LinearCrossEntropy`, what Liger's fused linear cross-entropy does);
  - otherwise (per-token losses, a wrapped or quantized head, no gradient) each chunk runs on its
    own, under activation checkpointing when there are several and gradients are on, so the backward
    recomputes one chunk's logits at a time.

Every loss in portachat goes through `chunked_cross_entropy` (GPT.forward with targets): SFT, mid,
fine-tuning, RL (per-token weights: the advantages), validation and bits-per-byte.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

LOGITS_CHUNK_BYTES = 256 * 2**20  # one chunk's fp32 logits
MIN_CHUNK, MAX_CHUNK = 256, 4096
REDUCTIONS = ("mean", "sum", "none")


def loss_chunk_size(vocab_size: int) -> int:
    """Positions per chunk: a power of two whose fp32 logits fit LOGITS_CHUNK_BYTES, within 256..4096
    (1,024 for a 49k vocabulary, 256 for Qwen's 152k)."""
    fits = max(1, LOGITS_CHUNK_BYTES // (4 * vocab_size))
    return max(MIN_CHUNK, min(MAX_CHUNK, 1 << (fits.bit_length() - 1)))


def _chunk_loss(hidden: torch.Tensor, targets: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor]
                ) -> torch.Tensor:  # fmt: skip
    return F.cross_entropy(head(hidden).float(), targets, reduction="none")


class _LinearCrossEntropy(torch.autograd.Function):
    """sum_i w_i * CE(hidden_i @ weight.T, target_i), its gradients computed chunk by chunk in forward."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None,
                chunk: int, compute_dtype: torch.dtype) -> torch.Tensor:
        want_hidden, want_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        w = weight.to(compute_dtype)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_weight else None
        for start in range(0, hidden.size(0), chunk):
            h = hidden[start : start + chunk].to(compute_dtype)
            t = targets[start : start + chunk]
            logits = (h @ w.t()).float()
            lse = torch.logsumexp(logits, dim=-1)
            loss = lse - logits.gather(1, t[:, None]).squeeze(1)
            scale = weights[start : start + chunk].float() if weights is not None else None
            total += (loss * scale).sum() if scale is not None else loss.sum()
            if not (want_hidden or want_weight):
                continue
            grad = logits.sub_(lse[:, None]).exp_()  # softmax, in place of the logits
            grad[torch.arange(t.numel(), device=t.device), t] -= 1.0
            if scale is not None:
                grad.mul_(scale[:, None])
            grad = grad.to(compute_dtype)
            if want_hidden:
                grad_hidden[start : start + chunk] = (grad @ w).to(hidden.dtype)
            if want_weight:
                grad_weight += (grad.t() @ h).float()
        ctx.save_for_backward(*(g for g in (grad_hidden, grad_weight) if g is not None))
        ctx.weight_dtype = weight.dtype
        return total

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        saved = list(ctx.saved_tensors)
        grad_hidden = saved.pop(0) * grad_output if ctx.needs_input_grad[0] else None
        grad_weight = None
        if ctx.needs_input_grad[1]:
            grad_weight = (saved.pop(0) * grad_output).to(ctx.weight_dtype)
        return grad_hidden, grad_weight, None, None, None, None


def _fused_head(head: object, weights: torch.Tensor | None) -> torch.Tensor | None:
    """The weight of a plain bias-free linear head, when the fused path applies."""
    if type(head) is not nn.Linear or head.bias is not None:
        return None
    if weights is not None and weights.requires_grad:
        return None
    return head.weight


@torch.compiler.disable  # data-dependent shapes (the supervised positions): eager, not one graph per count
def chunked_cross_entropy(
    hidden: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    targets: torch.Tensor,
    weights: torch.Tensor | None = None,
    reduction: str = "mean",
    chunk: int | None = None,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """Cross-entropy of `head(hidden)` against `targets`, in fp32, skipping targets equal to -1.

    hidden [..., C] and targets [...] (e.g. [B, T, C] and [B, T]); `head` maps [N, C] to [N, V]
    (the model's lm_head module: LoRA, tied or quantized heads all work). `weights` [...] multiplies
    each token's loss (RL advantages). reduction "sum", "mean" (over supervised tokens; NaN when
    there are none, as torch's) or "none" (per-token losses shaped like targets, 0 where ignored).
    `chunk`: positions per chunk (default loss_chunk_size of the vocabulary). `keep`: the flat indices of
    the supervised targets, when the caller found them on the host (else found here: a device sync)."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"loss_reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    shape = targets.shape
    flat_targets = targets.reshape(-1)
    flat_hidden = hidden.reshape(-1, hidden.size(-1))
    if keep is None:
        keep = (flat_targets >= 0).nonzero().squeeze(1)
    picked = flat_hidden.index_select(0, keep)
    picked_targets = flat_targets.index_select(0, keep)
    n = keep.numel()
    if chunk is None:
        probe = getattr(head, "out_features", None) or getattr(getattr(head, "weight", None), "shape", (0,))[0]
        chunk = loss_chunk_size(int(probe) or 2**16)
    weight = _fused_head(head, weights) if reduction != "none" and torch.is_grad_enabled() else None
    if weight is not None and (picked.requires_grad or weight.requires_grad):
        device_type = picked.device.type
        autocast = torch.is_autocast_enabled(device_type)
        compute = torch.get_autocast_dtype(device_type) if autocast else picked.dtype
        picked_weights = weights.reshape(-1).index_select(0, keep) if weights is not None else None
        with torch.autocast(device_type, enabled=False):
            total = _LinearCrossEntropy.apply(picked, weight, picked_targets, picked_weights, chunk, compute)
        return total if reduction == "sum" else total / n
    several = n > chunk
    recompute = several and torch.is_grad_enabled()
    pieces = []
    for start in range(0, n, chunk):
        args = (picked[start : start + chunk], picked_targets[start : start + chunk], head)
        pieces.append(checkpoint(_chunk_loss, *args, use_reentrant=False) if recompute else _chunk_loss(*args))
    per_token = torch.cat(pieces) if pieces else flat_hidden.new_zeros(0, dtype=torch.float32)
    if weights is not None:
        per_token = per_token * weights.reshape(-1).index_select(0, keep).float()
    if reduction == "sum":
        return per_token.sum()
    if reduction == "mean":
        return per_token.mean()
    full = torch.zeros(flat_targets.numel(), dtype=per_token.dtype, device=per_token.device)
    return full.index_copy(0, keep, per_token).view(shape)
