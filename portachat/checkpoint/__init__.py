"""Checkpoints: Hugging Face model directories plus resumable trainer state, written atomically."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from portachat.checkpoint.sharded import full_model, is_sharded
from portachat.checkpoint.trainer_state import collect_optimizers, save_rng, write_optimizers
from portachat.model.model_dir import LoadedModel, load_model_dir, read_meta, save_model_files
from portachat.storage.atomic import (
    CheckpointError,
    commit_tmp,
    prepare_tmp,
    tmp_dir_for,
    translate_os_error,
)
from portachat.storage.runs import (
    latest_checkpoint,
    prune_old,
    set_latest,
    stage_dir,
    step_dir_name,
)

__all__ = [
    "CheckpointError",
    "LoadedModel",
    "latest_checkpoint",
    "load_model_dir",
    "read_meta",
    "save_checkpoint",
    "stage_dir",
]


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def save_checkpoint(
    stage_path: Path,
    step: int,
    model: torch.nn.Module,
    tokenizer,
    meta: dict[str, Any],
    *,
    optimizers: list[torch.optim.Optimizer] | None = None,
    scaler=None,
    streams: list | None = None,
    stream_offset: int = 0,
    num_streams: int = 1,
    rng: dict[str, torch.Tensor] | None = None,
    env=None,
    device: torch.device | None = None,
    keep_last: int = 0,
) -> Path:
    """Write `<stage_path>/step_<N>/` atomically from every rank, then point `latest` at it.

    Rank 0 writes everything: the model directory, the optimizer state (FSDP2 shards gathered into
    whole tensors first), every rank's RNG state and data positions (gathered through the process
    group: no shared filesystem is assumed). Collective: every rank must call it. On any failure
    the temporary directory is removed and `latest` is untouched.
    """
    rank = env.rank if env is not None else 0
    is_main = rank == 0
    final = Path(stage_path) / step_dir_name(step)
    positions = {str(stream_offset + i): s.state_dict() for i, s in enumerate(streams or [])}
    if _distributed():
        gathered: list[dict | None] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, positions)
        positions = {k: v for part in gathered for k, v in (part or {}).items()}
    meta = dict(meta)
    meta["data_position"] = {"num_streams": num_streams, "streams": positions}
    rngs = {rank: rng} if rng is not None else {}
    if _distributed() and rng is not None:
        parts: list[dict | None] = [None] * dist.get_world_size()
        dist.all_gather_object(parts, {k: v.cpu() for k, v in rng.items()})
        rngs = dict(enumerate(parts))
    # Gathering sharded weights and moments is a collective: every rank takes part, rank 0 keeps them.
    sharded = is_sharded(model)
    whole = full_model(model)
    opt_state = None
    if optimizers and (is_main or sharded):
        opt_state = collect_optimizers(model, optimizers, scaler.state_dict() if scaler is not None else None)

    error: BaseException | None = None
    if is_main:
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            prepare_tmp(final)
        except BaseException as exc:  # noqa: BLE001 - reported to all ranks below
            error = exc
    _agree(error, device=device)
    tmp = tmp_dir_for(final)
    try:
        if is_main:
            save_model_files(tmp, whole, tokenizer, meta)
            if opt_state is not None:
                write_optimizers(tmp, *opt_state)
            for r, state in rngs.items():
                save_rng(tmp, r, state)
    except BaseException as exc:  # noqa: BLE001
        error = exc
    _agree(error, device=device, cleanup=tmp if is_main else None, final=final)
    if is_main:
        try:
            commit_tmp(tmp, final)
            set_latest(Path(stage_path), final)
            prune_old(Path(stage_path), keep_last)
        except BaseException as exc:  # noqa: BLE001
            shutil.rmtree(tmp, ignore_errors=True)
            error = exc
    _agree(error, device=device, final=final)
    return final


def _agree(
    error: BaseException | None,
    device: torch.device | None = None,
    cleanup: Path | None = None,
    final: Path | None = None,
) -> None:
    """All ranks learn whether any rank failed, so none waits forever at the next collective."""
    failed = error is not None
    if _distributed():
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
        raise CheckpointError(f"another rank failed while writing {final}; see its error above")
    translated = translate_os_error(final, error) if final is not None else error
    if translated is error:
        raise error
    raise translated from error
