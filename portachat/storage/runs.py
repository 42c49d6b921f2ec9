"""Where runs live: `<home>/runs/<run>/<stage>/step_<N>/`, with a `latest` pointer per stage."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from portachat.i18n import _
from portachat.storage.atomic import CheckpointError, write_text_atomic
from portachat.storage.paths import portachat_home

STEP_DIR = re.compile(r"^step_(\d+)$")
RUN_STAGES = ("rl", "sft", "mid", "base")  # furthest down the pipeline first


def stage_dir(run: str, stage: str, runs_root: Path | None = None) -> Path:
    root = runs_root if runs_root is not None else portachat_home() / "runs"
    return Path(root) / run / stage


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def list_steps(stage_path: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under a stage directory, oldest first (temp dirs are ignored)."""
    if not stage_path.is_dir():
        return []
    found = []
    for child in stage_path.iterdir():
        m = STEP_DIR.match(child.name)
        if m and child.is_dir() and (child / "portachat.json").is_file():
            found.append((int(m.group(1)), child))
    return sorted(found)


def set_latest(stage_path: Path, step_path: Path) -> None:
    write_text_atomic(stage_path / "latest", step_path.name + "\n")


def latest_checkpoint(stage_path: Path) -> Path | None:
    """The checkpoint `latest` points to, or None when the stage has none yet."""
    pointer = stage_path / "latest"
    if not pointer.is_file():
        return None
    target = stage_path / pointer.read_text(encoding="utf-8").strip()
    if not (target / "portachat.json").is_file():
        raise CheckpointError(
            _("{pointer} points to {target}, which is missing or incomplete. "
              "Point it at one of {steps} or start a fresh run.").format(
                pointer=pointer, target=target.name, steps=[p.name for _step, p in list_steps(stage_path)])
        )
    return target


def prune_old(stage_path: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` checkpoints (never the one `latest` points to)."""
    if keep_last <= 0:
        return
    current = latest_checkpoint(stage_path)
    steps = list_steps(stage_path)
    for _step, path in steps[:-keep_last]:
        if current is None or path.resolve() != current.resolve():
            shutil.rmtree(path, ignore_errors=True)
    for stale in stage_path.glob(".tmp-step_*"):
        shutil.rmtree(stale, ignore_errors=True)


def run_latest(run_path: Path) -> Path | None:
    """The checkpoint a run directory stands for: the `latest` of its furthest stage, as speedrun's final model."""
    for stage in RUN_STAGES:
        found = latest_checkpoint(run_path / stage)
        if found is not None:
            return found
    return None
