"""Process-group setup from the torchrun environment, with the collective chosen for the device."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from portachat.device.errors import DeviceError
from portachat.device.policy import EnvDefault
from portachat.device.probe import device_module

if TYPE_CHECKING:
    from portachat.device.device import Device

# Backends whose init_process_group accepts device_id= (binds the rank to its device, eager NCCL init).
DEVICE_ID_BACKENDS = ("nccl", "xccl")


_SET_BY_US: set[str] = set()  # the variables apply_env_defaults() set (the rest were the user's)


def apply_env_defaults(defaults: tuple[EnvDefault, ...], environ: dict[str, str] | None = None) -> list[dict]:
    """Set each default the user has not set (before the runtime reads it: first device use, process-group
    init); returns env_status()."""
    environ = os.environ if environ is None else environ
    for d in defaults:
        if d.name not in environ:
            environ[d.name] = d.value
            _SET_BY_US.add(d.name)
    return env_status(defaults, environ)


def env_status(defaults: tuple[EnvDefault, ...], environ: dict[str, str] | None = None) -> list[dict]:
    """Each default as it stands: the value in effect, and whether it is portachat's, the user's, or unset."""
    environ = os.environ if environ is None else environ
    status = []
    for d in defaults:
        value = environ.get(d.name)
        source = "unset" if value is None else "portachat" if d.name in _SET_BY_US and value == d.value else "user"
        status.append({"name": d.name, "value": value, "source": source, "default": d.value, "reason": d.reason})
    return status


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
            f"environment variable {name}={raw!r} must be an integer (torchrun sets it)"
        ) from None


def dist_env() -> DistEnv:
    """Rank layout from RANK / LOCAL_RANK / WORLD_SIZE / LOCAL_WORLD_SIZE; a single process when unset."""
    world = _int_env("WORLD_SIZE", 1)
    rank = _int_env("RANK", 0)
    local_rank = _int_env("LOCAL_RANK", 0)
    local_world = _int_env("LOCAL_WORLD_SIZE", world)
    if world < 1 or not 0 <= rank < world or not 0 <= local_rank < max(local_world, 1):
        raise DeviceError(
            f"inconsistent torchrun environment: RANK={rank} LOCAL_RANK={local_rank} WORLD_SIZE={world} "
            f"LOCAL_WORLD_SIZE={local_world}; launch with torchrun or unset these variables."
        )
    return DistEnv(rank=rank, local_rank=local_rank, world_size=world, local_world_size=local_world)


def shard_device_index(replica: int, rank: int, tensor_parallel_size: int) -> int:
    """The device index of tensor-parallel `rank` in data-parallel `replica`: replica i holds devices
    i*N .. i*N+N-1, so D replicas of N ranks use D*N devices, each once."""
    return replica * tensor_parallel_size + rank


def init_distributed(dev: Device, timeout_s: float | None = None, env: DistEnv | None = None, store=None,
                     bind_device: bool = True) -> DistEnv:  # fmt: skip
    """Join the process group when WORLD_SIZE > 1 (idempotent); a no-op for a single process.

    `timeout_s` None takes the device's collective timeout (PORTACHAT_DIST_TIMEOUT, default 2 h: long
    enough for rank-0-only preparation); the device's runtime defaults (HCCL timeouts on Ascend) are
    set before the group starts.

    `env` and `store` replace torchrun's environment for a process that starts its own group (the
    tensor-parallel server is rank 0 and hosts the rendezvous store its workers connect to).
    `bind_device=False` for a process that drives several devices (rank 0 of several tensor-parallel
    replicas): its groups must not all be bound to its first device."""
    env = env or dist_env()
    if not env.is_distributed:
        return env
    import torch.distributed as dist

    if dist.is_initialized():
        return env
    if not dev.supports_distributed:
        raise DeviceError(
            f"{dev.kind} runs a single process only (no collective backend), but WORLD_SIZE={env.world_size}. "
            "Run without torchrun, or set PORTACHAT_DEVICE=cpu to use gloo."
        )
    apply_env_defaults(dev.env_defaults)
    timeout_s = dev.dist_timeout_s if timeout_s is None else timeout_s
    kwargs: dict = {"backend": dev.dist_backend, "timeout": timedelta(seconds=timeout_s)}
    if store is not None:
        kwargs.update(store=store, rank=env.rank, world_size=env.world_size)
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        if store is None and var not in os.environ:
            raise DeviceError(f"WORLD_SIZE={env.world_size} but {var} is not set; launch with torchrun.")
    if dev.type != "cpu":
        device_module(dev.type).set_device(dev.index)
        if bind_device and dev.dist_backend in DEVICE_ID_BACKENDS:
            kwargs["device_id"] = dev.torch_device
    try:
        dist.init_process_group(**kwargs)
    except Exception as exc:
        from portachat.device.errors import diagnose

        hint = diagnose(exc)
        remedies = ("; ".join(hint.remedies)) if hint else "check MASTER_ADDR/MASTER_PORT and the network"
        raise DeviceError(
            f"init_process_group(backend={dev.dist_backend!r}) failed on rank {env.rank}/{env.world_size}: "
            f"{exc}. Try: {remedies}"
        ) from exc
    return env


def destroy_distributed() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def share_from_rank0(value: object, timeout_s: float = 48 * 3600) -> object:
    """Rank 0's `value` on every rank, through the process group (no shared filesystem assumed).

    Goes over a CPU (gloo) group with a long timeout: the other ranks may wait here for as long as
    rank 0 works on it (training a tokenizer on a large corpus outlasts the default group's timeout).
    If rank 0 fails instead, torchrun stops the waiting ranks."""
    import torch.distributed as dist

    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    try:
        box = [value]
        dist.broadcast_object_list(box, src=0, group=group)
    finally:
        dist.destroy_process_group(group)
    return box[0]
