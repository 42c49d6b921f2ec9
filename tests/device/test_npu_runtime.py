"""Ascend decisions from simulated probes: fused attention only on Atlas A2/A3, the runtime environment
defaults (set unless the user set them, shown by the doctor), and the collective timeout."""

from __future__ import annotations

import os
import sys
import types
from datetime import timedelta

import pytest
import torch
from device_sim import ascend, h100

from portachat.device import Device, DeviceError, get_device, init_distributed
from portachat.device.early_env import apply_env_defaults, env_status, npu_env_defaults
from portachat.device.policy import decide_attention, decide_dist_timeout, npu_fusion_supported
from portachat.speedrun.doctor import format_report

A2_A3 = ["Ascend910B1", "Ascend910B3", "Ascend910B4", "Ascend910_9392", "Ascend910_9382", "910B3"]
FIRST_GEN = ["Ascend910A", "Ascend910ProA", "Ascend910PremiumA", "Ascend910ProB", "Ascend310P3"]


@pytest.mark.parametrize("soc", A2_A3)
def test_fused_attention_on_atlas_a2_a3(soc):
    assert npu_fusion_supported(soc)
    decision = decide_attention(ascend(soc, bf16=True))
    assert decision.value == "npu_fusion_attention" and "A2/A3" in decision.reason


@pytest.mark.parametrize("soc", FIRST_GEN)
def test_first_generation_ascend_uses_sdpa_and_says_why(soc):
    assert not npu_fusion_supported(soc)
    dev = Device(ascend(soc, bf16=False))
    assert dev.attention_backend == "sdpa"
    assert "Atlas A2/A3" in dev.attention_reason and soc in dev.attention_reason


def test_forcing_fused_attention_on_910a_warns():
    decision = decide_attention(ascend("Ascend910A", bf16=False), "npu_fusion_attention")
    assert decision.value == "npu_fusion_attention"
    assert decision.warning and "Ascend910A" in decision.warning and "PORTACHAT_ATTENTION" in decision.warning


def test_dist_timeout_default_covers_rank0_preparation_and_can_be_set():
    default = decide_dist_timeout(None)
    assert default.value >= 3600 and "PORTACHAT_DIST_TIMEOUT" in default.reason
    assert decide_dist_timeout("900").value == 900
    for bad in ("soon", "0", "-5", "nan", "inf"):
        with pytest.raises(DeviceError, match="PORTACHAT_DIST_TIMEOUT"):
            decide_dist_timeout(bad)


def test_npu_env_defaults_follow_mindspeed_and_the_timeout():
    values = {d.name: d.value for d in npu_env_defaults("npu", 7200)}
    assert values == {"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True", "TASK_QUEUE_ENABLE": "2",
                      "CPU_AFFINITY_CONF": "1", "HCCL_CONNECT_TIMEOUT": "7200", "HCCL_EXEC_TIMEOUT": "7200"}
    short = {d.name: d.value for d in npu_env_defaults("npu", 30)}  # clamped into CANN's documented ranges
    assert (short["HCCL_CONNECT_TIMEOUT"], short["HCCL_EXEC_TIMEOUT"]) == ("120", "68")
    long = {d.name: d.value for d in npu_env_defaults("npu", 48 * 3600)}
    assert (long["HCCL_CONNECT_TIMEOUT"], long["HCCL_EXEC_TIMEOUT"]) == ("7200", "17340")
    assert npu_env_defaults("cuda", 7200) == () and Device(h100()).env_defaults == ()


def test_user_settings_win_and_are_marked():
    environ = {"HCCL_CONNECT_TIMEOUT": "300"}
    status = {s["name"]: s for s in apply_env_defaults(npu_env_defaults("npu", 7200), environ)}
    assert environ["HCCL_CONNECT_TIMEOUT"] == "300" and status["HCCL_CONNECT_TIMEOUT"]["source"] == "user"
    assert environ["TASK_QUEUE_ENABLE"] == "2" and status["TASK_QUEUE_ENABLE"]["source"] == "portachat"
    assert status["PYTORCH_NPU_ALLOC_CONF"]["value"] == "expandable_segments:True"


@pytest.fixture
def fake_npu(monkeypatch):
    """torch_npu as it looks after import, recording the environment at the first device query."""
    seen: dict[str, str | None] = {}
    npu = types.ModuleType("torch.npu")
    npu.is_available = lambda: True
    npu.device_count = lambda: 1

    def properties(i):
        seen.update({k: os.environ.get(k) for k in ("PYTORCH_NPU_ALLOC_CONF", "TASK_QUEUE_ENABLE")})
        return types.SimpleNamespace(name="Ascend910A", total_memory=32 * 2**30)

    npu.get_device_properties = properties
    npu.is_bf16_supported = lambda: False
    npu.set_device = lambda i: None
    fake = types.ModuleType("torch_npu")
    fake.__version__ = "2.9.0"
    fake.npu_fusion_attention = lambda *a, **k: None
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("PORTACHAT_DEVICE", "npu")
    return seen


def test_get_device_sets_runtime_defaults_before_the_device_starts(fake_npu, monkeypatch):
    monkeypatch.setenv("TASK_QUEUE_ENABLE", "1")  # the user's own choice stays
    dev = get_device()
    assert fake_npu == {"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True", "TASK_QUEUE_ENABLE": "1"}
    assert os.environ["HCCL_CONNECT_TIMEOUT"] == "7200"
    assert dev.attention_backend == "sdpa"  # torch_npu has the kernel, the 910A cannot run it
    report = {"versions": {}, "devices": [], "env": {}, "probes": {}, "checks": [], "ok": True,
              "decisions": {"attention": {"value": dev.attention_backend, "reason": dev.attention_reason}},
              "device": {"kind": "npu", "index": 0, "type": "npu", "count": 1,
                         "env_defaults": env_status(dev.env_defaults)}}
    text = format_report(report)
    assert "Atlas A2/A3" in text
    assert "TASK_QUEUE_ENABLE" in text and "set by you" in text and "portachat's default" in text


def test_process_group_gets_the_device_timeout_and_hccl_settings(fake_npu, monkeypatch):
    monkeypatch.setenv("PORTACHAT_DIST_TIMEOUT", "5400")
    for var, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(var, value)
    calls = []
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.distributed, "init_process_group",
                        lambda **kw: calls.append((kw, os.environ.get("HCCL_EXEC_TIMEOUT"))))
    dev = get_device()
    monkeypatch.delenv("HCCL_EXEC_TIMEOUT")  # set again right before the group starts
    init_distributed(dev)
    (kwargs, hccl_exec), = calls
    assert kwargs["backend"] == "hccl" and kwargs["timeout"] == timedelta(seconds=5400)
    assert hccl_exec == "5400"
    init_distributed(dev, timeout_s=120)  # an explicit timeout (doctor's probe) still wins
    assert calls[1][0]["timeout"] == timedelta(seconds=120)


def test_each_rank_sets_its_own_card_before_any_card_is_queried(monkeypatch):
    """On Ascend the first query of a card opens a context on it: rank 3 must touch card 3 only."""
    calls: list[tuple[str, int]] = []
    npu = types.ModuleType("torch.npu")
    npu.is_available = lambda: True
    npu.device_count = lambda: 8
    npu.set_device = lambda i: calls.append(("set_device", i))

    def properties(i):
        calls.append(("properties", i))
        return types.SimpleNamespace(name="Ascend910B3", total_memory=64 * 2**30)

    npu.get_device_properties = properties
    npu.is_bf16_supported = lambda: calls.append(("is_bf16_supported", -1)) or True
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("PORTACHAT_DEVICE", "npu")
    for var, value in {"RANK": "3", "LOCAL_RANK": "3", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"}.items():
        monkeypatch.setenv(var, value)
    dev = get_device()
    assert calls[0] == ("set_device", 3)
    assert {i for what, i in calls if what == "properties"} == {3}
    assert dev.index == 3 and dev.count == 8 and dev.name == "Ascend910B3"
