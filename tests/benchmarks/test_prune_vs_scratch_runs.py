"""benchmarks/prune_vs_scratch.py keeps running: a tiny smoke run (the pruned side healing by
distillation, its default) prints the perplexities and the ratio."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


def test_prune_vs_scratch_prints_a_ratio(shakespeare_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "prune_vs_scratch.py"), "--tiny", "--teacher-steps", "4",
         "--target-num-layers", "2", "--steps", "2", "--seq-len", "16", "--batch-size", "2",
         "--calibration-samples", "4", "--eval-rows", "4", "--device", "cpu", "--data", str(shakespeare_path), "--json"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ratio (scratch / prune+heal perplexity):" in proc.stdout
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record["layers"] == [4, 2] and record["ratio"] > 0
    assert record["heal"] == "distill"  # the pruned side heals as compress does by default
    assert set(record["perplexity"]) == {"teacher", "pruned", "healed", "scratch"}
