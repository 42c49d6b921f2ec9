"""Token masks in the sampler: packed bits (32 tokens per int32, llguidance's layout) expanded on
the host, and applied to the constrained rows only, so constrained and free requests share one batch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


def allocate_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    return torch.full((rows, (vocab_size + 31) // 32), -1, dtype=torch.int32)


def unpack(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 [R, W] (CPU) -> bool [R, vocab_size] (CPU): True where the token is allowed.

    numpy's unpackbits on the little-endian bytes (token 32w + 8b + j is bit j of byte b of word w):
    one single-threaded pass, where torch's shifts over [R, W, 32] would wake the intra-op thread
    pool, which costs milliseconds on a busy small CPU."""
    words = bitmask.numpy().astype("<i4", copy=False).view(np.uint8)
    return torch.from_numpy(np.unpackbits(words, axis=-1, count=vocab_size, bitorder="little").view(np.bool_))


@dataclass
class TokenMasks:
    rows: list[int]  # rows of the sampler's logits that are constrained
    bitmask: torch.Tensor  # int32 [len(rows), ceil(V/32)] (CPU), row i for logits row rows[i]

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits [S, V] with every disallowed token of a constrained row at -inf (a new tensor)."""
        if not self.rows:
            return logits
        allowed = unpack(self.bitmask[: len(self.rows)], logits.shape[-1]).to(logits.device, non_blocking=True)
        if self.rows == list(range(logits.shape[0])):  # every row constrained: one pass, no gather/scatter
            return logits.masked_fill(~allowed, float("-inf"))
        index = torch.tensor(self.rows, device=logits.device)
        masked = logits.index_select(0, index).masked_fill_(~allowed, float("-inf"))
        return logits.index_copy(0, index, masked)
