from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

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
