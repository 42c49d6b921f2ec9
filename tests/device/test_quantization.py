"""Quantization policy per vendor: a kernel that beats unquantized decode, or a clear error."""

from __future__ import annotations

import pytest
import torch
from device_sim import ascend, h100, hip, mps, v100, xpu

from portachat.device import DeviceError
from portachat.device.probe import ProbeResult
from portachat.device.quantization import (
    BACKEND_ATEN_CPU,
    BACKEND_TORCHAO,
    decide_quantization,
    normalize_mode,
)

CPU = ProbeResult(kind="cpu", device_type="cpu", names=["AMD EPYC"])


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_cpu_uses_aten_kernels_with_bf16_activations(mode):
    plan = decide_quantization(CPU, mode, cpu_capability="AVX512")
    assert plan.backend == BACKEND_ATEN_CPU and plan.activation_dtype == torch.bfloat16
    assert ("int8pack" if mode == "int8" else "int4pack") in plan.reason
    assert plan.warning is None
    assert (plan.group_size is None) == (mode == "int8")


def test_cpu_without_measured_simd_warns():
    plan = decide_quantization(CPU, "int8", cpu_capability="DEFAULT")
    assert plan.backend == BACKEND_ATEN_CPU and "benchmarks/quantize.py" in plan.warning


def test_cuda_int4_is_torchao_tinygemm():
    plan = decide_quantization(h100(), "int4")
    assert plan.backend == BACKEND_TORCHAO and plan.group_size == 128 and "tinygemm" in plan.reason


def test_cuda_int8_needs_inductor_else_clear_error():
    assert decide_quantization(h100(), "int8", compiles=True).backend == BACKEND_TORCHAO
    with pytest.raises(DeviceError, match="PORTACHAT_COMPILE=1"):
        decide_quantization(h100(), "int8", compiles=False)


@pytest.mark.parametrize(
    "facts, words",
    [
        (ascend("Ascend910B3", True), "npu_weight_quant_batchmatmul"),
        (hip("dcu", "gfx928", "K100_AI"), "Hygon DCU"),
        (hip("rocm", "gfx906", "MI50"), "gfx906"),
        (v100(), "capability 7.0"),
        (xpu(), "XPU"),
        (mps(), "MPS"),
    ],
)
@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_devices_without_a_kernel_refuse_with_a_way_out(facts, words, mode):
    with pytest.raises(DeviceError) as info:
        decide_quantization(facts, mode, compiles=True)
    message = str(info.value)
    assert words in message and f"--quantize {mode}" in message and "Run without --quantize" in message


def test_rocm_cdna_int4_uses_torchao():
    assert decide_quantization(hip("rocm", "gfx942", "MI300X"), "int4").backend == BACKEND_TORCHAO


def test_bad_mode_names_the_valid_ones():
    assert normalize_mode(" INT8 ") == "int8"
    with pytest.raises(DeviceError, match="valid values: int8, int4"):
        normalize_mode("int3")


def test_live_device_objects_get_the_same_decisions():
    from portachat.device import Device
    from portachat.device.quantization import quantization_plan

    assert quantization_plan(Device(CPU), "int4").backend == BACKEND_ATEN_CPU
    with pytest.raises(DeviceError, match="npu"):
        quantization_plan(Device(ascend("Ascend910B3", True)), "int8")
    # int8 on CUDA follows the compile decision: fused by inductor, or refused in eager mode
    assert quantization_plan(Device(h100(), compile=True), "int8").backend == BACKEND_TORCHAO
    with pytest.raises(DeviceError, match="PORTACHAT_COMPILE=1"):
        quantization_plan(Device(h100(), compile=False), "int8")
    with pytest.raises(DeviceError, match="PORTACHAT_COMPILE=1"):  # the caller runs eagerly after all
        quantization_plan(Device(h100(), compile=True), "int8", compiled=False)
