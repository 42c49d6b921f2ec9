from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import torch

from portachat.device import reset_device_cache
from portachat.speedrun.doctor import collect_report, format_report, run_doctor

ROOT = Path(__file__).resolve().parents[2]


def _clean(monkeypatch, tmp_path):
    for var in (
        "PORTACHAT_DEVICE",
        "PORTACHAT_DTYPE",
        "PORTACHAT_COMPILE",
        "PORTACHAT_ATTENTION",
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PORTACHAT_HOME", str(tmp_path))
    reset_device_cache()


def test_doctor_json_on_cpu_is_healthy(monkeypatch, tmp_path):
    _clean(monkeypatch, tmp_path)
    out = io.StringIO()
    code = run_doctor(as_json=True, stream=out)
    report = json.loads(out.getvalue())
    assert code == 0 and report["ok"]
    assert report["device"]["kind"] == "cpu"
    dtype = report["decisions"]["dtype"]
    assert dtype["value"] in ("fp32", "bf16") and "CPU" in dtype["reason"]
    assert report["decisions"]["collective"]["value"] == "gloo"
    packed = report["decisions"]["packed_attention"]  # how packed conversations attend, and why
    assert packed["value"] == "dense_mask" and "block-diagonal mask" in packed["reason"]
    assert report["probes"]["matmul_tflops"] > 0
    assert report["probes"]["h2d_gbps"] > 0 and "host" in report["probes"]["h2d_note"]
    assert report["probes"]["peak_flops"]["value"] > 0
    assert report["probes"]["allreduce"] is None
    assert report["versions"]["torch"] and report["versions"]["python"]
    assert all({"name", "ok", "severity", "message", "fix"} <= set(c) for c in report["checks"])


def test_bad_dtype_is_a_finding_with_exit_1(monkeypatch, tmp_path):
    _clean(monkeypatch, tmp_path)
    monkeypatch.setenv("PORTACHAT_DTYPE", "bf17")
    out = io.StringIO()
    assert run_doctor(as_json=True, stream=out) == 1
    report = json.loads(out.getvalue())
    failed = [c for c in report["checks"] if not c["ok"]]
    assert (
        failed[0]["name"] == "configuration"
        and "bf16, fp16, fp32" in failed[0]["message"]
        and failed[0]["fix"]
    )
    assert report["decisions_if_unconfigured"]["dtype"]["value"] in ("fp32", "bf16")
    text = format_report(report)
    assert "FAIL" in text and "bf17" in text and "problem(s) found" in text


def test_human_report_is_aligned_text(monkeypatch, tmp_path):
    _clean(monkeypatch, tmp_path)
    text = format_report(collect_report())
    for heading in ("Versions", "Devices", "Decisions", "Probes", "Checks", "Result: healthy"):
        assert heading in text
    assert "gloo" in text and "TFLOPS" in text


def test_calibrate_caches_a_calibrated_peak(monkeypatch, tmp_path):
    _clean(monkeypatch, tmp_path)
    report = collect_report(calibrate=True)
    source = report["probes"]["peak_flops"]["source"]
    if source.startswith("refused"):  # the machine got busier during the sweep: nothing may be cached
        assert "doctor --calibrate" in source and not (tmp_path / "calibration.json").exists()
    else:
        assert source == "calibrated" and (tmp_path / "calibration.json").exists()


def test_exit_code_in_a_fresh_process(tmp_path):
    code = "import sys; from portachat.speedrun.doctor import run_doctor; sys.exit(run_doctor(as_json=True))"
    env = {"PORTACHAT_HOME": str(tmp_path), "PORTACHAT_DTYPE": "bf17", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert json.loads(done.stdout)["ok"] is False


def test_selftest_checks_the_fast_paths_and_the_report_keeps_showing_them(monkeypatch, tmp_path):
    from portachat.device import fast_paths
    from portachat.ops import cpu_linear, fast_path

    _clean(monkeypatch, tmp_path)
    fast_paths.forget()
    fast_path.forget_all()
    real = cpu_linear._packed
    monkeypatch.setattr(cpu_linear, "_packed", lambda w, b, s, n: real(w * 2, b, s, n))  # a wrong packed product
    before = collect_report()
    assert {f["name"]: f["state"] for f in before["fast_paths"]} == {"cpu_kernels": "unchecked",
                                                                      "cpu_packed_linear": "unchecked"}
    out = io.StringIO()
    assert run_doctor(as_json=True, stream=out, selftest=True) == 0  # an off fast path is a warning, not a failure
    report = json.loads(out.getvalue())
    states = {f["name"]: f for f in report["fast_paths"]}
    if cpu_linear._packing_built(torch.float32) or cpu_linear._packing_built(torch.bfloat16):
        assert states["cpu_packed_linear"]["state"] == "off" and "disagrees" in states["cpu_packed_linear"]["reason"]
        assert any(c["name"] == "fast path" and not c["ok"] and c["severity"] == "warning" for c in report["checks"])
    fast_paths.forget()
    fast_path.forget_all()
    later = collect_report()  # another process: the cached verdicts, not checked again
    assert [f["state"] for f in later["fast_paths"]] == [states[f["name"]]["state"] for f in later["fast_paths"]]
    assert "Fast paths (self-tested)" in format_report(later)
