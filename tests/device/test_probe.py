"""probe() on this machine, and on simulated vendor stacks (a fake torch_npu, a fake HIP torch)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from portachat.device import DeviceError, get_device
from portachat.device.probe import probe


def test_probe_cpu_here():
    p = probe()
    assert p.kind == "cpu" and p.device_type == "cpu" and p.count == 1
    assert p.names and p.names[0]
    assert p.total_memory[0] > 0
    assert p.torch_version == torch.__version__
    assert p.default_dist_backend == "gloo"


def test_forcing_an_absent_device_is_a_clear_error():
    with pytest.raises(DeviceError, match="no cuda device"):
        probe("cuda")
    with pytest.raises(DeviceError, match="valid kinds"):
        probe("tpu")


class _Props(types.SimpleNamespace):
    pass


@pytest.fixture
def fake_npu(monkeypatch):
    """What torch_npu does at import: a torch.npu module and a torch_npu module with its kernels."""
    npu = types.ModuleType("torch.npu")
    npu.is_available = lambda: True
    npu.device_count = lambda: 2
    npu.get_device_properties = lambda i: _Props(name="Ascend910B3", total_memory=64 * 2**30)
    npu.is_bf16_supported = lambda: True
    npu.set_device = lambda i: None  # torch.npu.set_device: the probe makes this rank's card current first
    fake = types.ModuleType("torch_npu")
    fake.__version__ = "2.6.0.post1"
    fake.npu_fusion_attention = lambda *a, **k: None
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    return npu


def test_probe_with_fake_torch_npu(fake_npu, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    p = probe()
    assert p.kind == "npu" and p.device_type == "npu" and p.count == 2
    assert p.names == ["Ascend910B3", "Ascend910B3"]
    assert p.bf16_reported is True and p.torch_npu_version == "2.6.0.post1"
    assert p.attention_kernels == ("npu_fusion_attention",)
    for var, value in {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setenv("PORTACHAT_DEVICE", "npu")
    dev = get_device()
    assert (dev.kind, dev.index, dev.dist_backend) == ("npu", 1, "hccl")
    assert dev.dtype == torch.bfloat16 and not dev.compile


def test_probe_with_fake_hip_torch(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", "6.2.41133", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    props = _Props(name="", total_memory=64 * 2**30, major=9, minor=4, gcnArchName="gfx928:sramecc+:xnack-")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    p = probe("cuda")
    assert p.kind == "dcu" and p.gcn_arch == "gfx928" and p.hip_version.startswith("6.2")
    with pytest.raises(DeviceError, match="rocm"):
        probe("rocm")


def test_cpu_facts_and_the_cached_bf16_probe(tmp_path, monkeypatch):
    from portachat.device.probe import BF16_CPU_FLAGS, cpu_bf16_speedup, probe

    facts = probe("cpu")
    assert facts.cpu_cores and facts.cpu_cores >= 1
    native = any(f in facts.cpu_flags for f in BF16_CPU_FLAGS)
    assert (facts.cpu_bf16_speedup is not None) == native
    cache = tmp_path / "probe.json"
    monkeypatch.setenv("PORTACHAT_CPU_PROBE_CACHE", str(cache))
    first = cpu_bf16_speedup("Some CPU", ("avx512_bf16",))
    assert first is not None and first > 0 and cache.exists()
    import json

    key = next(iter(json.loads(cache.read_text())))
    cache.write_text(json.dumps({key: 1.234}))
    assert cpu_bf16_speedup("Some CPU", ("avx512_bf16",)) == 1.234  # cached: not measured again


def test_arm_cpu_facts_name_the_core(monkeypatch):
    """An Arm /proc/cpuinfo has no vendor or model name: the implementer and part name the core, whose
    vector units give the CPU's peak (Graviton2 = Neoverse N1: two 128-bit FMA pipes, 16 FLOP/cycle)."""
    import importlib

    from portachat.device import Device

    probe_mod = importlib.import_module("portachat.device.probe")  # the module, not the re-exported function
    graviton2 = {"processor": "0", "BogoMIPS": "243.75", "Features": "fp asimd evtstrm aes pmull asimdhp cpuid",
                 "CPU implementer": "0x41", "CPU architecture": "8", "CPU variant": "0x3", "CPU part": "0xd0c"}
    monkeypatch.setattr(probe_mod, "_cpuinfo", lambda: graviton2)
    facts = probe_mod.ProbeResult(kind="cpu", device_type="cpu", names=["aarch64"])
    probe_mod.fill_cpu_facts(facts)
    assert (facts.cpu_vendor, facts.cpu_part) == ("ARM", "0x41:0xd0c") and "asimdhp" in facts.cpu_flags
    assert facts.cpu_bf16_speedup is None  # no BF16 on N1: nothing to measure
    facts.cpu_cores, facts.cpu_max_mhz = 4, 2500.0
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    dev = Device(facts)
    assert dev.peak_flops(torch.float32).value == 4 * 16 * 2.5e9
    bf16 = dev.peak_flops(torch.bfloat16)
    assert bf16.value == 4 * 16 * 2.5e9 and "emulated" in bf16.source
