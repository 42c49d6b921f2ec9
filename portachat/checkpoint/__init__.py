"""Checkpoints: Hugging Face model directories plus resumable trainer state, written atomically."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from portachat.checkpoint.sharded import full_model, is_sharded
from portachat.checkpoint.trainer_state import collect_optimizers, save_rng, write_optimizers
from portachat.checkpoint.writer import gather_positions, gather_rngs, step_directory
from portachat.model.model_dir import LoadedModel, load_model_dir, read_meta, save_model_files
from portachat.storage.atomic import CheckpointError
from portachat.storage.runs import latest_checkpoint, stage_dir

# (the step's temporary directory, its meta) -> the model's files written there; rank 0 only
ModelWriter = Callable[[Path, dict[str, Any]], None]

__all__ = [
    "CheckpointError",
    "LoadedModel",
    "ModelWriter",
    "latest_checkpoint",
    "load_model_dir",
    "read_meta",
    "save_checkpoint",
    "stage_dir",
]


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
    write_model: ModelWriter | None = None,
) -> Path:
    """Write `<stage_path>/step_<N>/` atomically from every rank, then point `latest` at it.

    Rank 0 writes everything: the model directory, the optimizer state (FSDP2 shards gathered into
    whole tensors first), every rank's RNG state and data positions (gathered through the process
    group: no shared filesystem is assumed). Collective: every rank must call it. On any failure
    the temporary directory is removed and `latest` is untouched.

    `write_model` writes the model's files (a LoRA run: only its adapter, gathered beforehand on every
    rank); None = the whole model as an HF directory, gathered here.
    """
    is_main = (env.rank if env is not None else 0) == 0
    meta = {**meta, "data_position": gather_positions(streams or [], stream_offset, num_streams)}
    rngs = gather_rngs(env.rank if env is not None else 0, rng)
    # Gathering sharded weights and moments is a collective: every rank takes part, rank 0 keeps them.
    sharded = is_sharded(model)
    if write_model is None:
        whole = full_model(model)

        def write_model(tmp: Path, meta: dict[str, Any]) -> None:
            save_model_files(tmp, whole, tokenizer, meta)
    opt_state = None
    if optimizers and (is_main or sharded):
        opt_state = collect_optimizers(model, optimizers, scaler.state_dict() if scaler is not None else None)
    with step_directory(stage_path, step, is_main=is_main, device=device, keep_last=keep_last) as out:
        if is_main:
            write_model(out.tmp, meta)
            if opt_state is not None:
                write_optimizers(out.tmp, *opt_state)
            for r, state in rngs.items():
                save_rng(out.tmp, r, state)
    return out.final
