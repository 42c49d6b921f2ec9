"""Every device decision on the Ascend and Hygon parts portachat meets, from simulated probes: dtype,
compile, attention family, GQA path, peak FLOPs; and the torch each CANN release pairs with."""

from __future__ import annotations

import os

import pytest
import torch
from device_sim import ascend, hip

from portachat.device import Device
from portachat.device.early_env import apply_env_defaults, env_status
from portachat.device.flops import table_peak
from portachat.device.policy import decide_compile, hygon_triton
from portachat.speedrun.doctor import format_report

HYGON_TRITON = "2.1.0+das.opt1.dtk2404"  # the version Hygon's DAS wheels carry
UPSTREAM_TRITON = "3.1.0"


# name, bf16 reported by torch_npu, expected dtype, attention family, peak bf16/fp16 FLOP/s for MFU
ASCEND = [
    ("Ascend910B3", True, "bf16", "npu_fusion_attention", 313e12),
    ("Ascend910B", True, "bf16", "npu_fusion_attention", 313e12),
    ("Ascend910B1", True, "bf16", "npu_fusion_attention", 414e12),
    ("Ascend910_9391", True, "bf16", "npu_fusion_attention", 376e12),  # 910C (Atlas A3), per die
    ("Ascend910A", False, "fp16", "sdpa", 256e12),
    ("Ascend910ProB", False, "fp16", "sdpa", 256e12),
    ("Ascend310P3", False, "fp16", "sdpa", 70e12),
]


@pytest.mark.parametrize(("name", "bf16", "dtype", "attention", "peak"), ASCEND)
def test_ascend_decisions(name, bf16, dtype, attention, peak):
    dev = Device(ascend(name, bf16))
    assert dev.dtype_name == dtype and dev.attention_backend == attention
    assert dev.gqa == "repeat_kv"  # torch_npu's SDPA has no enable_gqa
    assert dev.compile_backend == "eager" and dev.dist_backend == "hccl"
    half = torch.bfloat16 if dtype == "bf16" else torch.float16
    assert table_peak(name, half) == pytest.approx(peak)


def test_ascend_bf16_without_torch_npus_answer_comes_from_the_name():
    assert Device(ascend("Ascend910B2", None)).dtype_name == "bf16"
    dev = Device(ascend("Ascend310P3", None))
    assert dev.dtype_name == "fp16" and "310P" in dev.dtype_reason


# arch, device name, expected dtype, compile with Hygon's Triton, compile with upstream Triton
DCU = [
    ("gfx906", "Z100", "fp16", "eager", "eager"),  # no bf16 units, and no Triton target
    ("gfx926", "K100", "fp16", "inductor", "eager"),
    ("gfx928", "K100_AI", "bf16", "inductor", "eager"),
    ("gfx936", "BW1000", "bf16", "inductor", "eager"),
    ("gfx938", "BW1100", "bf16", "inductor", "eager"),
]


@pytest.mark.parametrize(("arch", "name", "dtype", "with_das", "with_upstream"), DCU)
def test_dcu_decisions(arch, name, dtype, with_das, with_upstream):
    das = Device(hip("dcu", arch, name, triton_version=HYGON_TRITON))
    upstream = Device(hip("dcu", arch, name, triton_version=UPSTREAM_TRITON))
    assert das.dtype_name == upstream.dtype_name == dtype
    assert das.compile_backend == with_das and upstream.compile_backend == with_upstream
    if with_das == "inductor":
        assert "triton-das" in upstream.compile_reason and UPSTREAM_TRITON in upstream.compile_reason
    assert das.gqa == "native" and das.dist_backend == "nccl"


DCU_ENV = {"HSA_FORCE_FINE_GRAIN_PCIE": "1", "GPU_MAX_HW_QUEUES": "10", "RCCL_SDMA_COPY_ENABLE": "0"}


def test_a_dcu_gets_hygons_runtime_defaults_and_doctor_shows_them(monkeypatch):
    for name in DCU_ENV:  # start unset; monkeypatch puts the environment back afterwards
        monkeypatch.setenv(name, "x")
        monkeypatch.delenv(name)
    monkeypatch.setenv("GPU_MAX_HW_QUEUES", "4")  # the user's own
    dev = Device(hip("dcu", "gfx928", "K100_AI", triton_version=HYGON_TRITON))
    assert {d.name: d.value for d in dev.env_defaults} == DCU_ENV
    assert not Device(hip("rocm", "gfx942", "AMD Instinct MI300X")).env_defaults  # AMD's ROCm: none of Hygon's
    apply_env_defaults(dev.env_defaults)
    assert os.environ["HSA_FORCE_FINE_GRAIN_PCIE"] == "1" and os.environ["GPU_MAX_HW_QUEUES"] == "4"
    device = {"kind": "dcu", "index": 0, "type": "cuda", "count": 8, "env_defaults": env_status(dev.env_defaults)}
    text = format_report({"versions": {}, "devices": [], "env": {}, "probes": {}, "checks": [], "ok": True,
                          "decisions": {}, "device": device})
    rows = {line.split()[0]: line for line in text.splitlines() if line.split() and line.split()[0] in DCU_ENV}
    assert set(rows) == set(DCU_ENV)
    assert "set by you" in rows["GPU_MAX_HW_QUEUES"] and "portachat's default" in rows["RCCL_SDMA_COPY_ENABLE"]
    assert "RCCL" in rows["HSA_FORCE_FINE_GRAIN_PCIE"]  # with what it does


def test_dcu_peak_is_in_the_table_for_k100_ai():
    assert table_peak("K100_AI", torch.bfloat16) == pytest.approx(192e12)


def test_amd_keeps_compiling_with_upstream_triton():
    assert decide_compile(hip("rocm", "gfx942", "AMD Instinct MI300X", triton_version=UPSTREAM_TRITON)).value == \
        "inductor"


def test_hygon_triton_is_told_by_its_version():
    assert hygon_triton(HYGON_TRITON) and hygon_triton("3.0.0+das.opt4.dtk2504")
    assert not hygon_triton(UPSTREAM_TRITON) and not hygon_triton("3.1.0+rocm6.2") and not hygon_triton(None)


# CANN release -> the torch and torch_npu setup installs for it (tests/scripts/test_torch_pins.py checks the
# pairing against the floor); the decisions each torch gets.
CANN_TORCH = [("8.2.RC1", "2.6.0", "2.6.0"), ("8.3.RC1", "2.8.0", "2.8.0"), ("8.5.0", "2.9.0", "2.9.0"),
              ("9.0.0", "2.10.0", "2.10.0"), ("9.1.0", "2.12.0", "2.12.0")]


@pytest.mark.parametrize(("cann", "torch_version", "torch_npu_version"), CANN_TORCH)
def test_each_cann_releases_torch_gets_a_working_device(cann, torch_version, torch_npu_version):
    dev = Device(ascend("Ascend910B3", True, torch_version=torch_version, torch_npu_version=torch_npu_version))
    assert dev.dtype_name == "bf16" and dev.gqa == "repeat_kv" and dev.attention_backend == "npu_fusion_attention"
    assert dev.compile_backend == "eager" and dev.dist_backend == "hccl" and not dev.fused_optimizer
