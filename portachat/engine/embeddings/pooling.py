"""Hidden states [B, T, C] + a padding mask [B, T] -> one vector per input [B, C], as
sentence-transformers' Pooling module computes them (fp32)."""

from __future__ import annotations

import torch


def pool(hidden: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """`mask` is 1 on real tokens; inputs are right-padded (real tokens first)."""
    hidden = hidden.float()
    weights = mask.to(hidden.dtype).unsqueeze(-1)
    if mode == "cls":
        return hidden[:, 0]
    if mode == "last":
        last = mask.long().sum(1) - 1
        return hidden[torch.arange(hidden.size(0), device=hidden.device), last]
    if mode == "max":
        return hidden.masked_fill(weights == 0, -1e9).max(dim=1).values
    total = (hidden * weights).sum(1)
    count = weights.sum(1).clamp(min=1e-9)
    if mode == "mean":
        return total / count
    if mode == "mean_sqrt_len":
        return total / count.sqrt()
    raise ValueError(f"unknown pooling mode {mode!r}")
