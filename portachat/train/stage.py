"""What every training stage does before it builds its model: the stage's preamble, in one place.

`begin_stage()` picks the device and joins the process group, derives the stage's TrainConfig from
the one it was given (never changing the caller's), names the stage directory (storage/runs.py),
settles where the stage starts (resume this stage, start from another checkpoint, or from scratch;
rank 0's files decide, see checkpoint/replicate.py) and seeds every generator. A stage then builds
its model and data, derives its final config with `dataclasses.replace`, and hands both to the Trainer.

`plan_iterations()` is the one horizon planner for the chat-shaped stages: optimizer steps for a
number of epochs over conversations, however rows are packed, padded or drawn by a token budget.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from portachat.checkpoint import CheckpointError, latest_checkpoint
from portachat.checkpoint.replicate import checkpoint_from_rank0, rank0_decides
from portachat.data.chat_data import Conversation
from portachat.data.chat_loader import Bucket, batches_per_epoch
from portachat.device import Device, DistEnv, get_device, init_distributed
from portachat.device.shapes import pad_bucket
from portachat.i18n import _
from portachat.model.model_dir import read_meta
from portachat.model.source import resolve
from portachat.storage.runs import list_steps, stage_dir
from portachat.train.accumulation import TrainingError
from portachat.train.collectives import SINGLE_PROCESS
from portachat.train.config import TrainConfig
from portachat.train.defaults import PREVIOUS_STAGE

Render = Callable[[Any, int | None], tuple[list[int], list[int]]]  # (messages, max tokens) -> ids, mask

# Where rank 0 decides on its own files (inside rank0_decides): it deletes and waits for nobody.
RANK0_ALONE = SINGLE_PROCESS


@dataclass(frozen=True)
class StageStart:
    """Where a stage stands once its preamble has run."""

    dev: Device
    env: DistEnv
    cfg: TrainConfig  # the caller's config with `stage` set; the stage derives its final one from it
    path: Path  # the stage directory: <runs root>/<run>/<stage>
    runs_root: Path | None  # None = <PORTACHAT_HOME>/runs
    resume_from: Path | None  # this stage's checkpoint to continue (--resume)
    init_from: Path | None  # another checkpoint to start from (stages that start from trained weights)
    say: Callable[[str], None]  # prints on rank 0 only
    print_fn: Callable[[str], None]  # what the Trainer prints through (it picks rank 0 itself)

    @property
    def checkpoint(self) -> Path | None:
        """The checkpoint the model's shape and tokenizer come from: the resumed one, else the initial one."""
        return self.resume_from or self.init_from

    def origin(self) -> str | None:
        """The weights this stage first started from (a resumed run keeps its first start's)."""
        if self.init_from is not None:
            return str(self.init_from)
        return read_meta(self.resume_from).get("init_from") if self.resume_from is not None else None


def begin_stage(stage: str, train: TrainConfig, dev: Device | None = None, print_fn: Callable[[str], None] = print,
                *, resume: str | None = None, overwrite: bool = False, init: str | None = None,
                from_previous: bool = False) -> StageStart:
    """The preamble of stage `stage`. `resume`: "auto" (this stage's latest checkpoint) or a path;
    `overwrite`: delete this stage's checkpoints and start over; `from_previous`: when not resuming the
    stage starts from `init`, or from this run's previous stage (PREVIOUS_STAGE) when `init` is None."""
    dev = dev or get_device()
    env = init_distributed(dev)
    say = print_fn if env.is_main else (lambda _m: None)
    cfg = replace(train, stage=stage)
    runs_root = Path(cfg.runs_root) if cfg.runs_root else None
    path = stage_dir(cfg.run, stage, runs_root)
    if from_previous:
        resume_from, init_from = start_points(path, resume, overwrite, stage, init, cfg.run, runs_root)
    else:
        resume_from = checkpoint_from_rank0(
            lambda: prepare_stage_dir(path, resume, overwrite, stage, cfg.run, RANK0_ALONE), runs_root)
        init_from = None
    dev.manual_seed(cfg.seed)
    return StageStart(dev=dev, env=env, cfg=cfg, path=path, runs_root=runs_root, resume_from=resume_from,
                      init_from=init_from, say=say, print_fn=print_fn)


def resolve_init(stage: str, init: str | None, run: str, runs_root: Path | None) -> Path:
    """The checkpoint a stage starts from: --init, or the run's previous stage's latest checkpoint."""
    if init is not None:
        return resolve(init).path
    previous = PREVIOUS_STAGE[stage]
    where = stage_dir(run, previous, runs_root)
    found = latest_checkpoint(where)
    if found is None:
        raise CheckpointError(
            _("`train {stage}` starts from the {previous} stage, but run '{run}' has no {previous} checkpoint in "
              "{where}. Train it first (`portachat train {previous} --run-name {run}`) or pass --init PATH.").format(
                stage=stage, previous=previous, run=run, where=where)
        )
    return found


def prepare_stage_dir(path: Path, resume: str | None, overwrite: bool, stage: str, run: str, env: DistEnv) -> Path | None:
    """The checkpoint to resume from, after refusing to mix a new run into an existing one."""
    if resume and overwrite:
        raise TrainingError(_("--resume continues a run and --overwrite deletes it: pass one of them, not both"))
    if resume == "auto":
        found = latest_checkpoint(path)
        if found is None:
            raise CheckpointError(_("--resume: no checkpoint to resume in {path} (no `latest` pointer yet)").format(path=path))
        return found
    if resume:
        return resolve(resume).path
    if list_steps(path):
        if not overwrite:
            raise TrainingError(
                _("run '{run}' already has {stage} checkpoints in {path}. Continue it with --resume, "
                  "pick another --run-name, or pass --overwrite to start over (deletes them).").format(
                    run=run, stage=stage, path=path)
            )
        if env.is_main:
            shutil.rmtree(path)
        if env.is_distributed:
            torch.distributed.barrier()
    return None


def start_points(path: Path, resume: str | None, overwrite: bool, stage: str, init: str | None, run: str,
                 runs_root: Path | None) -> tuple[Path | None, Path | None]:
    """(resume_from, init_from), as rank 0 sees its files, present on every node (see checkpoint.replicate)."""
    def pick() -> tuple[str, Path]:
        found = prepare_stage_dir(path, resume, overwrite, stage, run, RANK0_ALONE)
        return ("resume", found) if found is not None else ("init", resolve_init(stage, init, run, runs_root))

    kind, picked = rank0_decides(pick)
    local = checkpoint_from_rank0(lambda: picked, runs_root)
    return (local, None) if kind == "resume" else (None, local)


def plan_iterations(convs: Sequence[Conversation], render: Render, cfg: TrainConfig, pack: bool, epochs: float,
                    streams: int, bucket: Bucket = pad_bucket, length_cache: dict[int, int] | None = None) -> int:
    """Optimizer steps for `epochs` passes over the conversations (packing estimated from a sample)."""
    per_epoch = batches_per_epoch(convs, render, cfg.max_seq_len, pack, int(cfg.device_batch_size), streams,
                                  cfg.tokens_per_batch, bucket, seed=cfg.seed, length_cache=length_cache)
    return max(1, math.ceil(epochs * per_epoch))
