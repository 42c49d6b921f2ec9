"""The one step-directory writer: `<stage>/step_<N>/` appears whole or not at all, on every rank's word.

Every checkpoint (`save_checkpoint`: a whole model, or a LoRA run's adapter through its model-files
hook) writes through `step_directory`: rank 0 prepares a temporary directory, every rank learns whether that worked, the
caller writes its files (rank 0 only: no shared filesystem is assumed, so per-rank state travels
through the process group first, `gather_positions` / `gather_rngs`), every rank learns whether
that worked, then rank 0 commits, moves `latest` and prunes old steps. A failure anywhere removes
the temporary directory on every rank's behalf and leaves `latest` where it was.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from portachat.i18n import _
from portachat.storage.atomic import CheckpointError, commit_tmp, prepare_tmp, tmp_dir_for, translate_os_error
from portachat.storage.runs import prune_old, set_latest, step_dir_name


@dataclass(frozen=True)
class StepDir:
    tmp: Path  # where the caller writes
    final: Path  # what it becomes on commit


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def gather_positions(streams: list, stream_offset: int, num_streams: int) -> dict[str, Any]:
    """Every rank's data-stream positions, for rank 0's portachat.json (collective under torchrun)."""
    positions = {str(stream_offset + i): s.state_dict() for i, s in enumerate(streams)}
    if distributed():
        gathered: list[dict | None] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, positions)
        positions = {k: v for part in gathered for k, v in (part or {}).items()}
    return {"num_streams": num_streams, "streams": positions}


def gather_rngs(rank: int, rng: dict[str, torch.Tensor] | None) -> dict[int, dict[str, torch.Tensor]]:
    """rank -> RNG state of every rank (collective under torchrun); {} when there is none to save."""
    if rng is None:
        return {}
    if not distributed():
        return {rank: rng}
    parts: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, {k: v.cpu() for k, v in rng.items()})
    return dict(enumerate(parts))


@contextmanager
def step_directory(stage_path: Path, step: int, *, is_main: bool, device: torch.device | None = None,
                   keep_last: int = 0) -> Iterator[StepDir]:
    """Collective: every rank enters, rank 0 writes into `.tmp`, and on leaving the step is committed
    and `latest` points at it - or, if any rank failed, nothing changed and every rank raises."""
    final = Path(stage_path) / step_dir_name(step)
    out = StepDir(tmp_dir_for(final), final)
    error: BaseException | None = None
    if is_main:
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            prepare_tmp(final)
        except BaseException as exc:  # noqa: BLE001 - reported to all ranks below
            error = exc
    agree(error, device=device)
    try:
        yield out
    except BaseException as exc:  # noqa: BLE001 - every rank hears of it below
        error = exc
    agree(error, device=device, cleanup=out.tmp if is_main else None, final=final)
    if is_main:
        try:
            commit_tmp(out.tmp, final)
            set_latest(Path(stage_path), final)
            prune_old(Path(stage_path), keep_last)
        except BaseException as exc:  # noqa: BLE001
            shutil.rmtree(out.tmp, ignore_errors=True)
            error = exc
    agree(error, device=device, final=final)


def agree(error: BaseException | None, device: torch.device | None = None, cleanup: Path | None = None,
          final: Path | None = None) -> None:
    """All ranks learn whether any rank failed, so none waits forever at the next collective."""
    failed = error is not None
    if distributed():
        # gloo reduces CPU tensors; device collectives (nccl, hccl, xccl) need the rank's device.
        on = device if device is not None and dist.get_backend() != "gloo" else torch.device("cpu")
        flag = torch.tensor([1.0 if failed else 0.0], device=on)
        dist.all_reduce(flag)
        failed = flag.item() > 0
    if not failed:
        return
    if cleanup is not None:
        shutil.rmtree(cleanup, ignore_errors=True)
    if error is None:
        raise CheckpointError(_("another rank failed while writing {final}; see its error above").format(final=final))
    translated = translate_os_error(final, error) if final is not None else error
    if translated is error:
        raise error
    raise translated from error
