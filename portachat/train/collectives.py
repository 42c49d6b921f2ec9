"""Sums over ranks for metrics and counts: the one wrapper stages reduce through.

No float64 reaches a collective: HCCL (Ascend) has no float64, and NCCL/Gloo gain nothing from it for
metrics. A float tensor travels as float32 (each rank may keep its own sums in float64: the CPU's
`accumulate_dtype`) and comes back in its own dtype; integer counts travel as they are.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from portachat.device import DistEnv


def sum_over_ranks(values: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """`values` summed over every rank (collective: every rank calls it); itself on a single process."""
    if not env.is_distributed:
        return values
    wire = values.float() if values.dtype == torch.float64 else values.clone()
    dist.all_reduce(wire)
    return wire.to(values.dtype)


# One process, no group: what code that may run outside a launched job reduces over.
SINGLE_PROCESS = DistEnv(rank=0, local_rank=0, world_size=1, local_world_size=1)
