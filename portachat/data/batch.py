"""A training micro-batch: inputs, targets (-1 = not supervised), optional per-token weights, and what
the loader knows of its rows (positions of packed sequences, real lengths) for exact accounting."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from portachat.device.inference import host_memory


@dataclass
class Batch:
    inputs: torch.Tensor  # int64 [B, T]
    targets: torch.Tensor  # int64 [B, T]; -1 where the token is not a training target (mask 0)
    weights: torch.Tensor | None = None  # float [B, T]; e.g. RL advantages per sampled token
    # int64 [B, T]: each input token's position within its own sequence, restarting at 0 where a packed
    # row's next conversation begins (attention stays inside each); None = 0..T-1, one sequence per row
    positions: torch.Tensor | None = None
    # real (non-padding) input tokens of each sequence, a packed row's conversations one by one;
    # None = every position is real and each row is one sequence
    lengths: tuple[int, ...] | None = None
    # int64 [S]: the flat indices of the supervised targets (targets.reshape(-1) >= 0), found on the host
    # by to() so that the loss needs no device-to-host sync to select them
    supervised: torch.Tensor | None = None

    def num_supervised(self) -> int:
        return int((self.targets >= 0).sum().item())

    def num_real(self) -> int:
        """Input positions that hold data, not padding."""
        return sum(self.lengths) if self.lengths is not None else self.inputs.numel()

    def attention_pairs(self) -> int:
        """Sum over sequences of their length squared: what attention's FLOPs scale with (the Trainer
        counts device.flops.attention_flops_per_token(..., seq_len=1) for each)."""
        if self.lengths is None:
            return self.inputs.size(0) * self.inputs.size(1) ** 2
        return sum(n * n for n in self.lengths)

    def to(self, device: torch.device) -> Batch:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return t.to(device, non_blocking=True) if t is not None else None

        supervised = self.supervised
        if supervised is None and host_memory(self.targets.device):  # found here, no device sync later
            supervised = (self.targets.reshape(-1) >= 0).nonzero().squeeze(1)
        return Batch(move(self.inputs), move(self.targets), move(self.weights), move(self.positions), self.lengths,
                     move(supervised))


def as_batch(item: Batch | tuple[torch.Tensor, torch.Tensor]) -> Batch:
    """Streams may yield a Batch or the plain (inputs, targets) pair pretraining loaders give."""
    if isinstance(item, Batch):
        return item
    inputs, targets = item
    return Batch(inputs, targets)
