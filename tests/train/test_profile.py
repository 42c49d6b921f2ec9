"""`portachat profile`: a real Chrome trace, top operators and a step-time breakdown."""

from __future__ import annotations

import json

import torch

from portachat.cli import main
from portachat.device import get_device, reset_device_cache
from portachat.model import GPTConfig
from portachat.train.profile import format_breakdown, profile_decode, profile_training


def test_training_profile_writes_a_trace_and_splits_the_step(tmp_path, monkeypatch):
    monkeypatch.delenv("PORTACHAT_DTYPE", raising=False)
    reset_device_cache()
    torch.set_num_threads(1)
    cfg = GPTConfig.from_depth(1, 384, max_seq_len=32, aspect_ratio=32, head_dim=32)
    result = profile_training(cfg, get_device("cpu", dtype="fp32"), tmp_path, batch_size=2, seq_len=32, steps=2, warmup=1)
    trace = json.loads(result.trace_path.read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert result.events == len(trace["traceEvents"]) > 0
    assert {"portachat.forward", "portachat.backward", "portachat.optimizer", "aten::mm"} <= names
    assert all(result.phase_ms[p] > 0 for p in ("forward", "backward", "optimizer"))
    assert result.phase_ms["communication"] == 0  # one process, no collectives
    assert sum(result.phase_ms[p] for p in ("data", "forward", "backward", "optimizer")) <= result.step_ms * 1.05
    assert "aten::mm" in result.top_ops
    text = format_breakdown(result)
    assert all(phase in text for phase in ("data", "forward", "backward", "optimizer", "communication"))


def test_decode_profile_times_the_engines_decode_steps(tmp_path, monkeypatch):
    monkeypatch.delenv("PORTACHAT_DTYPE", raising=False)
    reset_device_cache()
    torch.set_num_threads(1)
    cfg = GPTConfig.from_depth(1, 384, max_seq_len=64, aspect_ratio=32, head_dim=32)
    result = profile_decode(cfg, get_device("cpu", dtype="fp32"), tmp_path, batch_size=3, prompt_len=12, steps=3,
                            warmup=1)
    names = {e.get("name") for e in json.loads(result.trace_path.read_text())["traceEvents"]}
    assert {"portachat.step", "portachat.data", "portachat.forward"} <= names
    assert result.phase_ms["forward"] > 0 and result.phase_ms["data"] > 0
    assert result.phase_ms["data"] + result.phase_ms["forward"] <= result.step_ms * 1.05
    text = format_breakdown(result)
    assert "decode" in text and "backward" not in text and "sampling" in text


def test_cli_profiles_decode(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    code = main(["profile", "--mode", "decode", "--device", "cpu", "--dtype", "fp32", "--depth", "1", "--vocab-size",
                 "384", "--max-seq-len", "8", "--steps", "2", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0 and "Chrome trace" in out and "top operators" in out and "step-time breakdown (decode" in out
    assert json.loads((tmp_path / "trace_decode.json").read_text())["traceEvents"]
