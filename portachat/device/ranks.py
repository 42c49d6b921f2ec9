"""The rank layout torchrun gives this process (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE): read
by the Device (which device is this rank's) and by process-group setup."""

from __future__ import annotations

import os
from dataclasses import dataclass

from portachat.device.errors import DeviceError
from portachat.i18n import _


@dataclass
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _int_env(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise DeviceError(
            _("environment variable {name}={value} must be an integer (torchrun sets it)").format(
                name=name, value=repr(raw))
        ) from None


def dist_env() -> DistEnv:
    """Rank layout from RANK / LOCAL_RANK / WORLD_SIZE / LOCAL_WORLD_SIZE; a single process when unset."""
    world = _int_env("WORLD_SIZE", 1)
    rank = _int_env("RANK", 0)
    local_rank = _int_env("LOCAL_RANK", 0)
    local_world = _int_env("LOCAL_WORLD_SIZE", world)
    if world < 1 or not 0 <= rank < world or not 0 <= local_rank < max(local_world, 1):
        raise DeviceError(
            _("inconsistent torchrun environment: RANK={rank} LOCAL_RANK={local_rank} WORLD_SIZE={world} "
              "LOCAL_WORLD_SIZE={local_world}; launch with torchrun or unset these variables.").format(
                rank=rank, local_rank=local_rank, world=world, local_world=local_world)
        )
    return DistEnv(rank=rank, local_rank=local_rank, world_size=world, local_world_size=local_world)
