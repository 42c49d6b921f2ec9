"""How packed rows' document-masked attention runs, decided per device from simulated probes: compiled
flex_attention on CUDA, the Ascend fused kernel with its mask, SDPA with the dense mask elsewhere; each
with its reason, and the choice handed to ops/attention by get_device()."""

from __future__ import annotations

import pytest
from device_sim import ascend, cpu, h100, hip, mps, xpu

from portachat.device import Device, get_device
from portachat.device.fused_attention import KernelChoice, kernels_for, use_kernels
from portachat.device.policy import PACKED_ATTENTION


def test_cuda_with_flex_attention_and_inductor_runs_compiled_flex():
    dev = Device(h100())
    assert dev.packed_attention == "flex"
    assert "flex_attention" in dev.packed_attention_reason and "PORTACHAT_ATTENTION=sdpa" in dev.packed_attention_reason


@pytest.mark.parametrize(("probe", "why"), [
    (cpu(), "cpu: SDPA"),
    (mps(), "mps: SDPA"),
    (xpu(), "xpu: SDPA"),
    (hip("rocm", "gfx942", "AMD Instinct MI300X"), "CUDA only"),
    (h100(flex_attention=False), "no flex_attention"),
    (h100(triton_available=False), "Triton is not installed"),  # flex without compile would be slower
])
def test_everywhere_else_sdpa_takes_the_dense_block_mask(probe, why):
    dev = Device(probe)
    assert dev.packed_attention == "dense_mask"
    assert why in dev.packed_attention_reason


def test_turning_compile_or_the_fast_paths_off_turns_flex_off():
    no_compile = Device(h100(), compile=False)
    assert no_compile.packed_attention == "dense_mask" and "PORTACHAT_COMPILE=0" in no_compile.packed_attention_reason
    sdpa = Device(h100(), attention="sdpa")
    assert sdpa.packed_attention == "dense_mask" and "PORTACHAT_ATTENTION=sdpa" in sdpa.packed_attention_reason


def test_ascend_keeps_its_fused_kernel_with_the_mask():
    fused = Device(ascend("Ascend910B3", True))
    assert fused.attention_backend == "npu_fusion_attention"
    assert fused.packed_attention == "dense_mask" and "npu_fusion_attention" in fused.packed_attention_reason
    no_fusion = Device(ascend("Ascend910A", False))  # SDPA family: the dense mask through SDPA
    assert no_fusion.packed_attention == "dense_mask" and "npu: SDPA" in no_fusion.packed_attention_reason


def test_get_device_hands_the_choice_to_ops():
    before = use_kernels("cpu", KernelChoice(packed="flex"))
    try:
        dev = get_device("cpu")  # built here (the conftest empties the cache): its choice goes to the CPU's tensors
        assert kernels_for("cpu").packed == dev.packed_attention == "dense_mask"
        assert dev.packed_attention in PACKED_ATTENTION
        assert dev.describe()["packed_attention_reason"] == dev.packed_attention_reason  # what doctor --json shows
    finally:
        use_kernels("cpu", before)
