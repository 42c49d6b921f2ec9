"""benchmarks/prune_vs_scratch.py keeps running: a tiny smoke run prints the perplexities of the three
sides (pruned + distillation, pruned + cross-entropy, scratch) and the ratios to the distilled side."""

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
    assert "ratio ce/distill perplexity:" in proc.stdout and "ratio scratch/distill perplexity:" in proc.stdout
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record["layers"] == [4, 2] and record["sides"] == ["distill", "ce", "scratch"]
    assert set(record["perplexity"]) == {"teacher", "pruned", "distill", "ce", "scratch"}
    ppl = record["perplexity"]
    assert record["ratios"]["ce/distill"] == ppl["ce"] / ppl["distill"] > 0
    assert record["ratios"]["scratch/distill"] == ppl["scratch"] / ppl["distill"] > 0
    # The two healed sides start from the same pruned weights: the loss is the only difference.
    assert ppl["distill"] != ppl["ce"]


def test_a_speedrun_shaped_teacher_and_a_bad_side_list(shakespeare_path):
    base = [sys.executable, str(REPO / "benchmarks" / "prune_vs_scratch.py"), "--tiny", "--teacher-depth", "2",
            "--vocab-size", "512", "--teacher-steps", "2", "--target-num-layers", "1", "--steps", "1", "--seq-len", "16",
            "--batch-size", "2", "--calibration-samples", "4", "--eval-rows", "4", "--device", "cpu", "--data",
            str(shakespeare_path)]
    proc = subprocess.run([*base, "--sides", "distill,scratch", "--json"], capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record["layers"] == [2, 1] and set(record["ratios"]) == {"scratch/distill"}
    bad = subprocess.run([*base, "--sides", "distill,magic"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert bad.returncode == 2 and "--sides" in bad.stderr
