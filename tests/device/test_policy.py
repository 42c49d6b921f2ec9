"""Every vendor's decisions, from simulated probe results (no hardware needed)."""

from __future__ import annotations

import pytest
import torch
from device_sim import ascend, h100, hip, mps, v100, xpu

from portachat.device import Device, DeviceError
from portachat.device.policy import decide_collective, decide_compile, decide_dtype, normalize_dtype
from portachat.device.probe import ProbeResult, classify_hip


def test_h100_nccl_bf16_inductor_and_table_peak():
    dev = Device(h100())
    assert (dev.kind, dev.type) == ("cuda", "cuda")
    assert dev.dist_backend == "nccl" and dev.supports_distributed
    assert dev.dtype == torch.bfloat16 and not dev.needs_grad_scaler
    assert "9.0" in dev.dtype_reason
    assert dev.compile and dev.compile_backend == "inductor"
    assert dev.attention_backend == "sdpa"
    assert dev.fused_optimizer
    peak = dev.peak_flops(torch.bfloat16)
    assert (peak.value, peak.source) == (989e12, "table")


def test_h100_pcie_has_its_own_peak():
    dev = Device(h100(names=["NVIDIA H100 PCIe"]))
    assert dev.peak_flops(torch.bfloat16).value == 756e12


def test_h100_without_triton_stays_eager():
    dev = Device(h100(triton_available=False))
    assert not dev.compile and "Triton" in dev.compile_reason


def test_v100_uses_fp16_with_grad_scaler():
    dev = Device(v100())
    assert dev.dtype == torch.float16 and dev.needs_grad_scaler
    assert "7.0" in dev.dtype_reason


def test_ascend_910b_hccl_bf16_eager_fusion_attention():
    dev = Device(ascend("Ascend910B3", bf16=True))
    assert dev.dist_backend == "hccl"
    assert dev.dtype == torch.bfloat16
    assert not dev.compile and dev.compile_backend == "eager"
    assert dev.attention_backend == "npu_fusion_attention"
    assert not dev.fused_optimizer
    assert dev.peak_flops(torch.bfloat16).source == "table"


def test_ascend_910a_is_fp16_with_grad_scaler():
    dev = Device(ascend("Ascend910A", bf16=False))
    assert dev.dtype == torch.float16 and dev.needs_grad_scaler
    assert "is_bf16_supported() = False" in dev.dtype_reason


def test_ascend_910a_by_name_when_torch_npu_cannot_say():
    assert decide_dtype(ascend("Ascend910ProB", bf16=None)).value == "fp16"
    assert decide_dtype(ascend("Ascend910B2", bf16=None)).value == "bf16"


def test_ascend_sdpa_when_torch_npu_lacks_fusion_kernel():
    dev = Device(ascend("Ascend910B3", bf16=True, attention_kernels=()))
    assert dev.attention_backend == "sdpa"


def test_dcu_gfx906_fp16_and_gfx928_bf16_nccl():
    z100 = Device(hip("dcu", "gfx906", "Z100"))
    assert z100.dtype == torch.float16 and z100.needs_grad_scaler
    assert "gfx906" in z100.dtype_reason
    assert not z100.compile
    k100ai = Device(hip("dcu", "gfx928", "K100_AI", triton_version="2.1.0+das.opt1.dtk2404"))
    assert k100ai.dtype == torch.bfloat16
    assert k100ai.dist_backend == "nccl" and "RCCL" in k100ai.dist_reason
    assert k100ai.compile  # with Hygon's Triton; upstream Triton stays eager (test_first_contact.py)


def test_rocm_mi300x_bf16_and_peak():
    dev = Device(hip("rocm", "gfx942", "AMD Instinct MI300X"))
    assert dev.dtype == torch.bfloat16 and dev.dist_backend == "nccl"
    assert dev.peak_flops(torch.bfloat16).value == pytest.approx(1307.4e12)


def test_mps_is_single_process():
    dev = Device(mps())
    assert not dev.supports_distributed and dev.dist_backend == "none"
    assert dev.dtype == torch.bfloat16 and not dev.compile
    assert Device(mps("13.6")).dtype == torch.float32


def test_xpu_xccl():
    dev = Device(xpu())
    assert dev.dist_backend == "xccl" and dev.dtype == torch.bfloat16
    assert Device(xpu(bf16=False)).dtype == torch.float16


@pytest.mark.parametrize(
    ("arch", "names", "hy_smi", "expected"),
    [
        ("gfx928", [""], False, "dcu"),
        ("gfx936", [""], False, "dcu"),
        ("gfx906", ["Z100L"], False, "dcu"),
        ("gfx906", [""], True, "dcu"),
        ("gfx906", ["AMD Radeon Instinct MI50"], False, "rocm"),
        ("gfx942", ["AMD Instinct MI300X"], False, "rocm"),
    ],
)
def test_classify_hip(arch, names, hy_smi, expected):
    assert classify_hip(arch, names, hy_smi) == expected


def test_forced_dtype_and_compile_are_honoured_with_reason():
    dev = Device(v100(), dtype="bf16", compile=False)
    assert dev.dtype == torch.bfloat16 and "requested" in dev.dtype_reason
    assert dev.warnings and "bf16 forced" in dev.warnings[0]
    assert not dev.compile
    forced = decide_compile(ascend("Ascend910B3", bf16=True), True)
    assert forced.value == "inductor" and forced.warning


def test_bad_dtype_names_the_valid_values():
    with pytest.raises(DeviceError, match=r"bf17.*bf16, fp16, fp32"):
        normalize_dtype("bf17")
    assert normalize_dtype("bfloat16") == "bf16" and normalize_dtype("FP32") == "fp32"


def test_collective_prefers_torch_default_when_it_differs():
    p = h100(default_dist_backend="gloo")
    assert decide_collective(p).value == "gloo"
    assert decide_collective(ProbeResult(kind="cpu", device_type="cpu")).value == "gloo"


def test_index_beyond_visible_devices_is_a_clear_error():
    with pytest.raises(DeviceError, match="LOCAL_RANK"):
        Device(v100(), index=3)


def test_cpu_dtype_follows_native_bf16_and_the_measured_speedup():
    from portachat.device.policy import decide_dtype

    def cpu(flags=(), speedup=None):
        return ProbeResult(kind="cpu", device_type="cpu", cpu_flags=flags, cpu_bf16_speedup=speedup)

    plain = decide_dtype(cpu(("avx2", "fma")))
    assert plain.value == "fp32" and "AVX512-BF16" in plain.reason
    fast = decide_dtype(cpu(("avx512f", "avx512_bf16"), 1.65))
    assert fast.value == "bf16" and "1.65x" in fast.reason and "PORTACHAT_DTYPE" in fast.reason
    assert decide_dtype(cpu(("amx_bf16",), 3.0)).reason.startswith("CPU with AMX-BF16")
    slow = decide_dtype(cpu(("avx512_bf16",), 1.05))
    assert slow.value == "fp32" and "1.05x" in slow.reason
    assert decide_dtype(cpu(("avx512_bf16",), None)).value == "fp32"
    assert decide_dtype(cpu(("avx512_bf16",), 2.0), "fp32").value == "fp32"  # override wins
    forced = decide_dtype(cpu(("avx2",)), "bf16")
    assert forced.value == "bf16" and forced.warning


def test_fp8_is_native_on_ada_hopper_and_mi300_only():
    from portachat.device.policy import fp8_support

    assert fp8_support(h100()).value == "float8_e4m3fn"
    assert fp8_support(h100(capability=(8, 9))).value == "float8_e4m3fn"  # Ada (L4, L40S)
    a100 = fp8_support(h100(capability=(8, 0)))
    assert a100.value is None and "8.0 < 8.9" in a100.reason
    assert fp8_support(hip("rocm", "gfx942")).value == "float8_e4m3fnuz"
    assert fp8_support(hip("rocm", "gfx950")).value == "float8_e4m3fn"
    assert fp8_support(hip("rocm", "gfx90a")).value is None
    assert fp8_support(hip("dcu", "gfx928")).value is None
    assert Device(h100()).fp8_dtype == torch.float8_e4m3fn and Device(mps()).fp8_dtype is None
