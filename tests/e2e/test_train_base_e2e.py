"""End-to-end pretraining through the real CLI: learning, HF interop, exact resume, torchrun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests.e2e.helpers import cli_env, run_cli, step_losses

pytestmark = pytest.mark.slow

TINY = ["--depth", "2", "--max-seq-len", "64", "--device-batch-size", "4", "--vocab-size", "512",
        "--eval-tokens", "2048", "--log-every", "1", "--dtype", "fp32", "--compile", "0"]


def test_shakespeare_learns_and_loads_in_transformers(tmp_path, shakespeare_path):
    home = tmp_path / "home"
    proc = run_cli(["train", "base", "--data", str(shakespeare_path), "--depth", "4", "--max-seq-len", "256",
                    "--device-batch-size", "8", "--num-iterations", "70", "--eval-every", "35",
                    "--eval-tokens", "16384", "--log-every", "10", "--dtype", "fp32"], home, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    final = home / "runs" / "default" / "base" / "step_000070"
    meta = json.loads((final / "portachat.json").read_text())
    bpb, baseline = meta["metrics"]["val_bpb"], meta["unigram_bpb"]
    print(f"val bpb {bpb:.4f} vs unigram {baseline:.4f}")
    assert bpb < 0.85 * baseline, (bpb, baseline)
    assert "sample |" in proc.stdout  # samples were printed

    from transformers import AutoModelForCausalLM

    from portachat.checkpoint import load_model_dir

    ours = load_model_dir(final).model.eval()
    hf = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32).eval()
    x = torch.randint(0, ours.config.vocab_size, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (hf(x).logits - ours(x)).abs().max().item()
    assert diff < 1e-4, diff


def test_sigkill_and_resume_gives_identical_losses(tmp_path, shakespeare_path):
    home = tmp_path / "home"
    common = ["train", "base", "--data", str(shakespeare_path), *TINY, "--num-iterations", "16",
              "--eval-every", "0", "--save-every", "4"]
    ref = run_cli([*common, "--run", "ref"], home)
    assert ref.returncode == 0, ref.stderr[-3000:]
    expected = step_losses(home / "runs" / "ref" / "base" / "log.jsonl")
    assert sorted(expected) == list(range(1, 17))

    stage = home / "runs" / "killed" / "base"
    victim = subprocess.Popen([sys.executable, "-m", "portachat", *common, "--run", "killed"],
                              env=cli_env(home), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and victim.poll() is None:
        if (stage / "latest").is_file() and (stage / "latest").read_text().strip() == "step_000008":
            break
        time.sleep(0.05)
    assert victim.poll() is None, "the run finished before it could be killed"
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    killed_at = (stage / "latest").read_text().strip()
    assert killed_at in ("step_000008", "step_000012")

    resumed = run_cli([*common, "--run", "killed", "--resume"], home)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout
    got = step_losses(stage / "log.jsonl")
    assert sorted(got) == list(range(1, 17))
    for step in range(1, 17):
        assert got[step] == pytest.approx(expected[step], rel=0, abs=1e-6), (step, got[step], expected[step])


def test_torchrun_two_processes_match_one_process(tmp_path, shakespeare_path):
    home = tmp_path / "home"
    common = ["train", "base", "--data", str(shakespeare_path), *TINY, "--num-iterations", "6", "--eval-every", "0"]
    single = run_cli([*common, "--run", "single", "--total-batch-size", str(4 * 64 * 2)], home)
    assert single.returncode == 0, single.stderr[-3000:]

    env = cli_env(home, threads=1)
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "-m", "portachat", *common, "--run-name", "ddp"], env=env, capture_output=True, text=True,
                         timeout=600)
    assert ddp.returncode == 0, ddp.stdout[-3000:] + ddp.stderr[-3000:]
    assert "weights identical on all 2 ranks" in ddp.stdout
    assert "gloo" in (home / "runs" / "ddp" / "base" / "step_000006" / "portachat.json").read_text()

    a = step_losses(home / "runs" / "single" / "base" / "log.jsonl")
    b = step_losses(home / "runs" / "ddp" / "base" / "log.jsonl")
    assert sorted(a) == sorted(b) == list(range(1, 7))
    for step in a:
        assert b[step] == pytest.approx(a[step], abs=1e-4), (step, a[step], b[step])

    from safetensors.torch import load_file

    wa = load_file(str(home / "runs" / "single" / "base" / "step_000006" / "model.safetensors"))
    wb = load_file(str(home / "runs" / "ddp" / "base" / "step_000006" / "model.safetensors"))
    for name in wa:
        assert torch.allclose(wa[name], wb[name], atol=1e-4), name


def test_ctrl_c_saves_and_stops_at_a_step_boundary(tmp_path, shakespeare_path):
    home = tmp_path / "home"
    stage = home / "runs" / "default" / "base"
    proc = subprocess.Popen([sys.executable, "-m", "portachat", "train", "base", "--data", str(shakespeare_path),
                             *TINY, "--num-iterations", "100000", "--eval-every", "0"],
                            env=cli_env(home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (stage / "log.jsonl").is_file():
        time.sleep(0.1)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    step = int((stage / "latest").read_text().strip().split("_")[1])
    assert step >= 1
    meta = json.loads((stage / f"step_{step:06d}" / "portachat.json").read_text())
    assert meta["step"] == step and meta["final"] is False
    assert "resume with --resume" in err
