"""benchmarks/serve.py keeps running: a tiny smoke run against a tiny checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from api_testing import tiny_model

from portachat.model.model_dir import save_model_files

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_serve_benchmark_prints_a_ratio(tmp_path, small_tokenizer):
    model_dir = tmp_path / "tiny"
    model_dir.mkdir()
    save_model_files(model_dir, tiny_model(small_tokenizer.vocab_size), small_tokenizer, meta={"stage": "test"})
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "serve.py"), "--model", str(model_dir), "--concurrency", "4",
         "--sequential", "2", "--max-tokens", "8", "--max-model-len", "128", "--dtype", "fp32",
         "--kv-cache-gb", "0.01", "--rounds", "2", "--json"],
        capture_output=True, text=True, timeout=600, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "concurrent / one at a time, output tok/s:" in proc.stdout
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    (label,) = record["ratios"]  # one server: tensor and data parallel size 1
    assert record["ratio"] == record["ratios"][label] > 0 and record["left_running"] == {label: 0}
    assert len(record["rounds"]) == 2 and all(r[label]["ratio"] > 0 for r in record["rounds"])
    for r in record["rounds"]:
        assert r[label]["runs"]["4 concurrent"]["ok"] == 4 and r[label]["runs"]["one at a time"]["ok"] == 2
