"""Known-bad vendor combinations, from simulated probe results."""

from __future__ import annotations

from portachat.device.health import environment_checks, torch_npu_pair_check
from portachat.device.probe import ProbeResult


def _failed(p: ProbeResult, devices=None) -> dict[str, str]:
    return {c.name: c.fix for c in environment_checks(p, devices) if not c.ok}


def _npu(**kw) -> ProbeResult:
    base = dict(
        kind="npu",
        device_type="npu",
        names=["Ascend910B3"],
        torch_version="2.6.0",
        torch_npu_version="2.6.0",
        torch_npu_installed=True,
        env={"ASCEND_TOOLKIT_HOME": "/usr/local/Ascend/ascend-toolkit/latest"},
    )
    return ProbeResult(**{**base, **kw})


def test_healthy_npu_has_no_findings():
    assert _failed(_npu()) == {}


def test_torch_npu_beside_cuda_torch():
    assert "torch_npu beside CUDA torch" in _failed(_npu(cuda_version="12.4"))


def test_transfer_to_npu_imported():
    assert "remove" in _failed(_npu(transfer_to_npu_imported=True))["transfer_to_npu imported"]


def test_cann_env_not_sourced():
    assert "set_env.sh" in _failed(_npu(env={}))["CANN environment"]


def test_version_pairs():
    assert torch_npu_pair_check("2.6.0+cpu", "2.6.0.post2").ok
    bad = torch_npu_pair_check("2.7.1", "2.5.1")
    assert not bad.ok and bad.severity == "error" and "2.7.1" in bad.fix
    patch = torch_npu_pair_check("2.7.1", "2.7.0")
    assert not patch.ok and patch.severity == "warning"
    assert "torch/torch_npu versions" in _failed(_npu(torch_version="2.8.0"))


def test_dcu_without_dtk_env():
    p = ProbeResult(
        kind="dcu", device_type="cuda", names=["K100_AI"], hip_version="6.2", torch_version="2.5.1"
    )
    assert _failed(p)["DTK environment"] == "source /opt/dtk/env.sh"
    p.env = {"ROCM_PATH": "/opt/dtk"}
    assert _failed(p) == {}


def test_unused_gpu_is_a_warning():
    p = ProbeResult(
        kind="cpu", device_type="cpu", torch_version="2.9.0+cpu", vendor_clis={"nvidia-smi": True}
    )
    checks = [c for c in environment_checks(p) if not c.ok]
    assert checks[0].severity == "warning" and "CUDA build" in checks[0].fix


def test_unhealthy_device_is_an_error():
    devices = [
        {"index": 0, "name": "910B3", "total_memory": 1, "health": "OK"},
        {"index": 1, "name": "910B3", "total_memory": 1, "health": "Alarm"},
    ]
    failed = [c for c in environment_checks(_npu(), devices) if not c.ok]
    assert [c.name for c in failed] == ["device health"] and "device 1 (910B3)" in failed[0].message
