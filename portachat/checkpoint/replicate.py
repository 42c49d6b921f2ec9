"""Checkpoints on several nodes without a shared filesystem.

Rank 0 writes every checkpoint into its own home. When a stage starts from (or resumes) a
checkpoint, rank 0 decides which one, the path is re-rooted in each rank's own runs directory, and
a node that lacks the files receives them from rank 0 through the process group and writes them
there (once per node), so every rank then reads the same files locally.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch.distributed as dist

from portachat.device.dist import dist_env, share_from_rank0
from portachat.i18n import _
from portachat.storage.atomic import CheckpointError, atomic_directory
from portachat.storage.paths import portachat_home

T = TypeVar("T")


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank0_decides(fn: Callable[[], T]) -> T:
    """`fn()` run on rank 0 only; its result, or the error it raised, on every rank."""
    if not _distributed():
        return fn()
    outcome: list = [None]
    if dist.get_rank() == 0:
        try:
            outcome[0] = ("ok", fn())
        except Exception as exc:  # noqa: BLE001 - re-raised on every rank below
            outcome[0] = ("error", exc)
    dist.broadcast_object_list(outcome, src=0)
    kind, value = outcome[0]
    if kind == "error":
        raise value
    return value


def checkpoint_from_rank0(fn: Callable[[], Path | None], runs_root: Path | None) -> Path | None:
    """The checkpoint rank 0's `fn` picks, present and readable on every rank.

    A path inside rank 0's runs directory is the same path inside each rank's own runs directory
    (homes may differ between nodes); a node without that checkpoint gets a copy from rank 0."""
    root = (Path(runs_root) if runs_root is not None else portachat_home() / "runs").resolve()

    def pick() -> tuple[str | None, str | None]:
        path = fn()
        if path is None:
            return None, None
        path = Path(path).resolve()
        return str(path), (str(path.relative_to(root)) if path.is_relative_to(root) else None)

    absolute, relative = rank0_decides(pick)
    if absolute is None:
        return None
    local = root / relative if relative is not None else Path(absolute)
    replicate_dir(local)
    return local


def _identity(path: Path) -> tuple | None:
    """What tells two copies of a checkpoint apart: its files' names and sizes, and its metadata's hash."""
    meta = path / "portachat.json" if (path / "portachat.json").is_file() else path / "config.json"
    if not meta.is_file():
        return None
    sizes = tuple((str(f.relative_to(path)), f.stat().st_size) for f in sorted(path.rglob("*")) if f.is_file())
    return sizes, hashlib.sha256(meta.read_bytes()).hexdigest()


def replicate_dir(path: Path) -> None:
    """Make every node hold rank 0's checkpoint directory `path` (collective; rank 0 must have it).

    A node whose copy is missing or differs (a stale run of the same name) gets rank 0's files."""
    if not _distributed():
        return
    mine = _identity(path)
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if everyone[0] is None:
        raise CheckpointError(_("{path} is missing on rank 0, which should send it to the other nodes").format(path=path))
    if all(x == everyone[0] for x in everyone):
        return
    files: list = [None]
    if dist.get_rank() == 0:
        files[0] = {str(f.relative_to(path)): f.read_bytes() for f in sorted(path.rglob("*")) if f.is_file()}
    received = share_from_rank0(files[0])  # long timeout: large files take a while
    if mine != everyone[0] and dist_env().local_rank == 0:  # one writer per node: its ranks share a filesystem
        with atomic_directory(path) as tmp:
            for rel, data in received.items():
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                (tmp / rel).write_bytes(data)
    dist.barrier()
    if _identity(path) != everyone[0]:
        raise CheckpointError(_("{path} did not reach this node's filesystem (rank {rank}); copy the "
                                "checkpoint there by hand or give every node the same --runs-root").format(
            path=path, rank=dist.get_rank()))
