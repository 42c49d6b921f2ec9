"""Running the real command line in a subprocess, as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def cli_env(home: Path, threads: int = 2) -> dict[str, str]:
    env = dict(os.environ)
    env.update(PORTACHAT_HOME=str(home), OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1", PORTACHAT_DEVICE="cpu")
    return env


def run_cli(args: list[str], home: Path, timeout: float = 600, threads: int = 2) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "portachat", *args],
        env=cli_env(home, threads),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def step_losses(log: Path) -> dict[int, float]:
    """Per-step training loss from log.jsonl; a resumed run's later entries win."""
    losses: dict[int, float] = {}
    for line in log.read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        if "loss" in rec:
            losses[rec["step"]] = rec["loss"]
    return losses
