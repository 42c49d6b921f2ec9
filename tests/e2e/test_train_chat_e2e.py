"""The chat stages through the real CLI: base -> mid -> sft -> rl on the synthetic curriculum, torchrun, resume."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.e2e.helpers import cli_env, run_cli, step_losses

pytestmark = pytest.mark.slow

DEVICE = ["--dtype", "fp32", "--compile", "0", "--log-every", "1"]
CHAT = [*DEVICE, "--device-batch-size", "4", "--max-conversations", "400", "--eval-examples", "4",
        "--eval-max-tokens", "16", "--eval-tokens", "1024"]


def test_base_mid_sft_chain_through_the_cli(tmp_path):
    home = tmp_path / "home"
    base = run_cli(["train", "base", "--depth", "1", "--max-seq-len", "128", "--device-batch-size", "4",
                    "--vocab-size", "512", "--num-iterations", "4", "--eval-every", "0", "--eval-tokens", "1024",
                    *DEVICE], home)
    assert base.returncode == 0, base.stdout[-2000:] + base.stderr[-2000:]

    mid = run_cli(["train", "mid", "--num-iterations", "12", "--eval-every", "6", "--save-every", "6", *CHAT], home)
    assert mid.returncode == 0, mid.stdout[-2000:] + mid.stderr[-2000:]
    assert "SYNTHETIC" in mid.stdout and "heldout_accuracy" in mid.stdout
    mid_dir = home / "runs" / "default" / "mid"
    losses = step_losses(mid_dir / "log.jsonl")
    assert sorted(losses) == list(range(1, 13)) and losses[12] < losses[1]
    meta = json.loads((mid_dir / "step_000012" / "portachat.json").read_text())
    assert meta["init_from"].endswith("base/step_000004")

    # Resuming from the step-6 checkpoint replays steps 7..12 exactly.
    again = run_cli(["train", "mid", "--num-iterations", "12", "--eval-every", "6", "--save-every", "6",
                     "--resume", str(mid_dir / "step_000006"), "--run-name", "default", *CHAT], home)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    resumed = step_losses(mid_dir / "log.jsonl")
    for step in range(7, 13):
        assert resumed[step] == pytest.approx(losses[step], abs=1e-6), step

    sft = run_cli(["train", "sft", "--num-iterations", "3", "--eval-every", "0", *CHAT], home)
    assert sft.returncode == 0, sft.stdout[-2000:] + sft.stderr[-2000:]
    sft_meta = json.loads((home / "runs" / "default" / "sft" / "step_000003" / "portachat.json").read_text())
    assert sft_meta["init_from"].endswith("mid/step_000012") and sft_meta["pack"] is False

    rl = run_cli(["train", "rl", "--num-iterations", "2", "--num-samples", "2", "--device-batch-size", "4",
                  "--max-new-tokens", "8", "--max-prompts", "8", "--eval-examples", "2", *DEVICE], home)
    assert rl.returncode == 0, rl.stdout[-2000:] + rl.stderr[-2000:]
    rl_log = [json.loads(x) for x in (home / "runs" / "default" / "rl" / "log.jsonl").read_text().splitlines()]
    assert all({"reward", "pass_at_k", "response_length"} <= set(r) for r in rl_log if "loss" in r)
    rl_meta = json.loads((home / "runs" / "default" / "rl" / "step_000002" / "portachat.json").read_text())
    assert rl_meta["init_from"].endswith("sft/step_000003")

    missing = run_cli(["train", "sft", "--run-name", "other", *CHAT], home)
    assert missing.returncode != 0 and "portachat train mid --run-name other" in missing.stderr


def test_torchrun_mid_two_processes(tmp_path):
    home = tmp_path / "home"
    base = run_cli(["train", "base", "--depth", "1", "--max-seq-len", "128", "--device-batch-size", "4",
                    "--vocab-size", "512", "--num-iterations", "2", "--eval-every", "0", "--eval-tokens", "1024",
                    *DEVICE], home)
    assert base.returncode == 0, base.stderr[-2000:]
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "portachat", "train", "mid", "--num-iterations", "4", "--eval-every", "2", *CHAT],
                          env=cli_env(home, threads=1), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "weights identical on all 2 ranks" in proc.stdout
    meta = json.loads((home / "runs" / "default" / "mid" / "step_000004" / "portachat.json").read_text())
    assert meta["world_size"] == 2 and 0.0 <= meta["metrics"]["heldout_accuracy"] <= 1.0
