"""benchmarks/gpu_check.sh --dry-run: the GPU check's whole plan at toy size on the CPU, every part
under its own timeout, with its status and figures in summary.json and summary.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

PARTS = ("doctor", "train_throughput", "profile", "train_base", "estimate", "engine_graphs", "decode")


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_dry_run_writes_every_part(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "PORTACHAT_HOME": str(tmp_path / "home"),
           "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))}
    proc = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--dry-run", "--out", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=380)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mode"] == "dry-run" and list(summary["parts"]) == list(PARTS)
    budgets = 0
    for name, part in summary["parts"].items():
        assert part["status"] == "ok", (name, (out / f"{name}.log").read_text()[-2000:])
        assert part["seconds"] <= part["budget_s"]
        budgets += part["budget_s"]
    assert budgets <= 7 * 60  # the plan fits the 7 minutes a lent GPU gets
    parts = summary["parts"]
    assert parts["doctor"]["result"]["ok"] is True
    assert parts["train_throughput"]["result"]["ours_tok_s"] > 0 and parts["train_throughput"]["result"]["ratio"] > 0
    assert {"forward", "backward", "optimizer"} <= set(parts["profile"]["result"]["split"])
    assert parts["train_base"]["result"]["steps"] == 3 and summary["memory"]["estimated_peak_bytes"] > 0
    graphs = parts["engine_graphs"]["result"]
    assert graphs["graphs_vs_eager"][0]["dtype"] == "float32" and graphs["graphs_vs_eager"][0]["identical"]
    assert graphs["two_threads"]["ok"]
    assert set(parts["decode"]["result"]["by_batch"]) == {"1", "2"}
    md = (out / "summary.md").read_text()
    assert all(f"| {name} | ok |" in md for name in PARTS) and "Goals" in md


def test_unknown_option_is_refused():
    proc = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--dryrun"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2 and "--dry-run" in proc.stderr
