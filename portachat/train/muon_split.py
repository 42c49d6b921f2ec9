"""Muon's orthogonalisation split across data-parallel ranks, and its view of sharded (FSDP2) parameters.

Every rank holds the same averaged gradients, so without care every rank would run the same
Newton-Schulz iterations on every matrix. Instead each rank orthogonalises a 1/world share of a
stack of same-shape updates and an all-gather hands every rank all the results. Each matrix is
computed by exactly one rank and copied to the others, so the ranks stay bit-identical.

Under FSDP2 a parameter, its gradient and its momentum are DTensor shards, while Newton-Schulz
needs the whole matrix: `full()` gathers an update, `add_update()` adds this rank's slice back.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def share(n: int, world: int, rank: int) -> tuple[int, int]:
    """[start, stop) of the matrices rank `rank` orthogonalises out of `n` (the last ranks may get fewer)."""
    chunk = -(-n // world)
    start = min(n, rank * chunk)
    return start, min(n, start + chunk)


def orthogonalize(
    stacked: torch.Tensor,
    orthogonalize_fn: Callable[[torch.Tensor], torch.Tensor],
    out_dtype: torch.dtype,
    split: bool = True,
) -> torch.Tensor:
    """`orthogonalize_fn` (which returns `out_dtype`) over a [n, rows, cols] stack, split across the
    ranks when `split` and distributed. The result is identical on every rank."""
    world = world_size() if split else 1
    n = stacked.size(0)
    if world == 1 or n == 1:  # a single matrix: every rank computing it costs less than a collective
        return orthogonalize_fn(stacked)
    chunk = -(-n // world)
    start, stop = share(n, world, dist.get_rank())
    padded = torch.zeros((chunk, *stacked.shape[1:]), dtype=out_dtype, device=stacked.device)
    if stop > start:
        padded[: stop - start] = orthogonalize_fn(stacked[start:stop])
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    return torch.cat(parts)[:n]


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor: an FSDP2 shard is all-gathered (a collective: every rank must call it)."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def add_update(p: torch.Tensor, update: torch.Tensor, alpha: float) -> None:
    """p += alpha * update, where `update` is the whole matrix (identical on every rank) and p may be a shard."""
    if isinstance(p, DTensor):
        # src_data_rank=None: every rank already holds the same full update, so each keeps its own slice
        # without any communication.
        update = distribute_tensor(update.to(p.dtype), p.device_mesh, p.placements, src_data_rank=None)
    p.add_(update.to(p.dtype), alpha=alpha)
