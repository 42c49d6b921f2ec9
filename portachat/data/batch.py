"""A training micro-batch: inputs, targets (-1 = not supervised) and optional per-token weights."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Batch:
    inputs: torch.Tensor  # int64 [B, T]
    targets: torch.Tensor  # int64 [B, T]; -1 where the token is not a training target (mask 0)
    weights: torch.Tensor | None = None  # float [B, T]; e.g. RL advantages per sampled token

    def num_supervised(self) -> int:
        return int((self.targets >= 0).sum().item())

    def to(self, device: torch.device) -> Batch:
        weights = self.weights.to(device, non_blocking=True) if self.weights is not None else None
        return Batch(self.inputs.to(device, non_blocking=True), self.targets.to(device, non_blocking=True), weights)


def as_batch(item: Batch | tuple[torch.Tensor, torch.Tensor]) -> Batch:
    """Streams may yield a Batch or the plain (inputs, targets) pair pretraining loaders give."""
    if isinstance(item, Batch):
        return item
    inputs, targets = item
    return Batch(inputs, targets)
