"""Process-group setup from the torchrun environment, with the collective chosen for the device."""

from __future__ import annotations

import os
import socket
import tempfile
from datetime import timedelta

import torch.distributed as dist

from portachat.device.device import Device
from portachat.device.early_env import apply_env_defaults
from portachat.device.errors import DeviceError, diagnose
from portachat.device.probe import device_module
from portachat.device.ranks import DistEnv, dist_env
from portachat.i18n import _

# Backends whose init_process_group accepts device_id= (binds the rank to its device, eager NCCL init).
DEVICE_ID_BACKENDS = ("nccl", "xccl")
# The variable that pins a backend's own sockets (gloo's pair listeners, NCCL's bootstrap) to one
# interface; without it they bind the address the host name resolves to, often a LAN one.
INTERFACE_VARS = {"gloo": "GLOO_SOCKET_IFNAME", "nccl": "NCCL_SOCKET_IFNAME"}


def shard_device_index(replica: int, rank: int, tensor_parallel_size: int) -> int:
    """The device index of tensor-parallel `rank` in data-parallel `replica`: replica i holds devices
    i*N .. i*N+N-1, so D replicas of N ranks use D*N devices, each once."""
    return replica * tensor_parallel_size + rank


def loopback_interface() -> str:
    """The loopback interface's name ("lo" on Linux, "lo0" on macOS and the BSDs)."""
    names = [name for _index, name in socket.if_nameindex()]
    return next((n for n in ("lo", "lo0") if n in names), "lo")


def private_store(world_size: int, directory: str | None = None, timeout_s: float = 600):
    """A rendezvous store that listens nowhere: a torch FileStore in a directory only this user can
    enter (made with mode 0700 when `directory` is None; one given must be this user's and 0700).
    For process groups whose ranks all run on this machine as this user (tensor-parallel workers).
    Returns (store, directory); the caller removes the directory when the group is gone."""
    if directory is None:
        directory = tempfile.mkdtemp(prefix="portachat-store-")  # 0700
    info = os.stat(directory)
    if info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise DeviceError(_("the rendezvous directory {directory} must belong to this user with mode 0700 (it has "
                            "uid {uid}, mode {mode}); restart the command").format(
                                directory=directory, uid=info.st_uid, mode=oct(info.st_mode & 0o777)))
    store = dist.FileStore(os.path.join(directory, "store"), world_size)
    store.set_timeout(timedelta(seconds=timeout_s))
    return store, directory


def init_distributed(dev: Device, timeout_s: float | None = None, env: DistEnv | None = None, store=None,
                     bind_device: bool = True, loopback: bool = False) -> DistEnv:  # fmt: skip
    """Join the process group when WORLD_SIZE > 1 (idempotent); a no-op for a single process.

    `timeout_s` None takes the device's collective timeout (PORTACHAT_DIST_TIMEOUT, default 2 h: long
    enough for rank-0-only preparation); the device's runtime defaults (HCCL timeouts on Ascend) are
    set before the group starts.

    `env` and `store` replace torchrun's environment for a process that starts its own group (the
    tensor-parallel server is rank 0 and hosts the rendezvous store its workers connect to).
    `bind_device=False` for a process that drives several devices (rank 0 of several tensor-parallel
    replicas): its groups must not all be bound to its first device. `loopback=True` for a group
    whose ranks all run on this machine: the backend's own sockets are bound to the loopback
    interface (gloo, NCCL; other backends' host sockets follow their own settings)."""
    env = env or dist_env()
    if not env.is_distributed:
        return env
    if dist.is_initialized():
        return env
    if not dev.supports_distributed:
        raise DeviceError(
            _("{kind} runs a single process only (no collective backend), but WORLD_SIZE={world}. "
              "Run without torchrun, or set PORTACHAT_DEVICE=cpu to use gloo.").format(
                kind=dev.kind, world=env.world_size)
        )
    apply_env_defaults(dev.env_defaults)
    timeout_s = dev.dist_timeout_s if timeout_s is None else timeout_s
    kwargs: dict = {"backend": dev.dist_backend, "timeout": timedelta(seconds=timeout_s)}
    if store is not None:
        kwargs.update(store=store, rank=env.rank, world_size=env.world_size)
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        if store is None and var not in os.environ:
            raise DeviceError(_("WORLD_SIZE={world} but {var} is not set; launch with torchrun.").format(
                world=env.world_size, var=var))
    if loopback and dev.dist_backend in INTERFACE_VARS:
        os.environ[INTERFACE_VARS[dev.dist_backend]] = loopback_interface()
    if dev.type != "cpu":
        device_module(dev.type).set_device(dev.index)
        if bind_device and dev.dist_backend in DEVICE_ID_BACKENDS:
            kwargs["device_id"] = dev.torch_device
    try:
        dist.init_process_group(**kwargs)
    except Exception as exc:
        hint = diagnose(exc)
        detail = hint.line(exc) if hint else _("{error}. What to do: check MASTER_ADDR/MASTER_PORT and the "
                                               "network").format(error=exc)
        raise DeviceError(
            _("init_process_group(backend={backend}) failed on rank {rank}/{world}: {detail}").format(
                backend=repr(dev.dist_backend), rank=env.rank, world=env.world_size, detail=detail)
        ) from exc
    return env


def destroy_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def share_from_rank0(value: object, timeout_s: float = 48 * 3600) -> object:
    """Rank 0's `value` on every rank, through the process group (no shared filesystem assumed).

    Goes over a CPU (gloo) group with a long timeout: the other ranks may wait here for as long as
    rank 0 works on it (training a tokenizer on a large corpus outlasts the default group's timeout).
    If rank 0 fails instead, torchrun stops the waiting ranks."""
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    try:
        box = [value]
        dist.broadcast_object_list(box, src=0, group=group)
    finally:
        dist.destroy_process_group(group)
    return box[0]
