"""`--nproc 2 --fsdp on` through the real CLI: FSDP2 pretraining with validation and samples, then
mid-training whose held-out evaluator generates through the engine on every rank."""

from __future__ import annotations

import json

import pytest

from tests.e2e.helpers import run_cli

pytestmark = pytest.mark.slow

DEVICE = ["--dtype", "fp32", "--compile", "0", "--log-every", "1", "--nproc", "2", "--fsdp", "on"]


def test_fsdp2_base_then_mid_with_nproc(tmp_path):
    home = tmp_path / "home"
    base = run_cli(["train", "base", "--depth", "1", "--max-seq-len", "64", "--device-batch-size", "2",
                    "--vocab-size", "384", "--tokenizer-max-chars", "200000", "--num-iterations", "3",
                    "--eval-every", "0", "--eval-tokens", "512", *DEVICE], home, threads=1)
    assert base.returncode == 0, base.stdout[-3000:] + base.stderr[-3000:]
    assert "launching:" in base.stderr and "torch.distributed.run" in base.stderr
    assert "sample |" in base.stdout and base.stdout.count("validation bits/byte") == 2  # rank 0 alone prints
    meta = json.loads((home / "runs" / "default" / "base" / "step_000003" / "portachat.json").read_text())
    assert meta["world_size"] == 2 and meta["parallel"] == "fsdp2" and meta["metrics"]["val_bpb"] > 0

    mid = run_cli(["train", "mid", "--num-iterations", "2", "--eval-every", "0", "--device-batch-size", "2",
                   "--max-conversations", "100", "--eval-examples", "4", "--eval-max-tokens", "8",
                   "--eval-tokens", "512", *DEVICE], home, threads=1)
    assert mid.returncode == 0, mid.stdout[-3000:] + mid.stderr[-3000:]
    mid_meta = json.loads((home / "runs" / "default" / "mid" / "step_000002" / "portachat.json").read_text())
    assert mid_meta["parallel"] == "fsdp2" and 0.0 <= mid_meta["metrics"]["heldout_accuracy"] <= 1.0
