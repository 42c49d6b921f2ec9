"""Bits per byte: a loss that does not depend on the tokenizer, so runs with different vocabularies compare."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist

from portachat.i18n import _


@torch.no_grad()
def evaluate_bpb(
    model: torch.nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    token_bytes: torch.Tensor,
    device: torch.device,
    autocast: Callable[[], object],
) -> float:
    """Sum of next-token losses (nats) over targets, divided by ln 2 times the bytes those targets spell.

    Special tokens spell 0 bytes and are left out of both sums. Sums are all-reduced across ranks.
    """
    token_bytes = token_bytes.to(device)
    # Per-batch sums in fp32 on the device, the running total in Python floats: MPS has no float64.
    total_nats, total_bytes = 0.0, 0
    was_training = model.training
    model.eval()
    for inputs, targets in batches:
        inputs, targets = inputs.to(device), targets.to(device)
        with autocast():
            loss = model(inputs, targets, loss_reduction="none").reshape(-1).float()
        flat = targets.reshape(-1)
        valid = flat >= 0
        nbytes = torch.where(valid, token_bytes[flat.clamp(min=0)], torch.zeros_like(flat))
        counted = nbytes > 0
        total_nats += (loss * counted).sum().item()
        total_bytes += int(nbytes.sum().item())
    model.train(was_training)
    if dist.is_available() and dist.is_initialized():
        # fp32 nats and int64 bytes: no float64 on the device (Ascend's HCCL and MPS lack it)
        nats = torch.tensor([total_nats], dtype=torch.float32, device=device)
        nbytes_all = torch.tensor([total_bytes], dtype=torch.int64, device=device)
        dist.all_reduce(nats)
        dist.all_reduce(nbytes_all)
        total_nats, total_bytes = nats.item(), int(nbytes_all.item())
    if total_bytes == 0:
        raise ValueError(_("validation data spelled 0 bytes: nothing to evaluate"))
    return total_nats / (math.log(2) * total_bytes)


def unigram_bpb(
    train_targets: Iterable[torch.Tensor], val_targets: Iterable[torch.Tensor], token_bytes: torch.Tensor
) -> float:
    """The baseline a model must beat: bits per byte of a unigram (token frequency) model.

    Frequencies come from training tokens with add-one smoothing; scored on the validation targets.
    """
    vocab = token_bytes.numel()
    counts = torch.ones(vocab, dtype=torch.float64)
    for t in train_targets:
        t = t.reshape(-1)
        counts += torch.bincount(t[t >= 0], minlength=vocab)[:vocab].double()
    logp = torch.log(counts / counts.sum())
    nats, nbytes = 0.0, 0
    tb = token_bytes.long()
    for t in val_targets:
        t = t.reshape(-1)
        t = t[(t >= 0)]
        t = t[tb[t] > 0]
        nats -= logp[t].sum().item()
        nbytes += int(tb[t].sum().item())
    return nats / (math.log(2) * nbytes)
