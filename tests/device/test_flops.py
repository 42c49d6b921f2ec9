from __future__ import annotations

import torch

from portachat.device.flops import cached_peak, calibration_key, save_calibration, table_peak


def test_table_entries():
    assert table_peak("NVIDIA H100 80GB HBM3", torch.bfloat16) == 989e12
    assert table_peak("NVIDIA H100 PCIe", torch.float16) == 756e12
    assert table_peak("NVIDIA H200", torch.bfloat16) == 989e12
    assert table_peak("NVIDIA A100-SXM4-80GB", torch.bfloat16) == 312e12
    assert table_peak("NVIDIA A100-SXM4-80GB", torch.float32) == 19.5e12
    assert table_peak("NVIDIA A10G", torch.bfloat16) == 70e12
    assert table_peak("NVIDIA A10", torch.bfloat16) == 125e12
    assert table_peak("AMD Instinct MI300X", torch.bfloat16) == 1307.4e12
    assert table_peak("Ascend910B3", torch.bfloat16) == 313e12
    assert table_peak("Ascend910A", torch.bfloat16) is None  # no bf16 on 910A
    assert table_peak("Ascend910A", torch.float16) == 256e12
    assert table_peak("Intel(R) Xeon(R) Processor", torch.float32) is None


def test_calibration_cache_roundtrip():
    assert cached_peak("Some Accelerator", torch.bfloat16) is None
    save_calibration("Some Accelerator", torch.bfloat16, 1.5e14, "calibrated")
    got = cached_peak("Some Accelerator", torch.bfloat16)
    assert (got.value, got.source) == (1.5e14, "calibrated")
    assert cached_peak("Some Accelerator", torch.float16) is None
    assert "bf16" in calibration_key("x", torch.bfloat16) and torch.__version__ in calibration_key(
        "x", torch.bfloat16
    )


def test_cpu_spec_peak_from_cores_lanes_fma_and_clock():
    from portachat.device.flops import cpu_spec_peak

    zen5 = ("fma", "avx2", "avx512f", "avx512_bf16")
    # 2 cores x 16 fp32 lanes x 2 (FMA) x 2 pipes x 2.6 GHz
    assert cpu_spec_peak(zen5, "AuthenticAMD", 26, 2, 2600, torch.float32) == 2 * 16 * 2 * 2 * 2.6e9
    assert cpu_spec_peak(zen5, "AuthenticAMD", 26, 2, 2600, torch.bfloat16) == 2 * 2 * 16 * 2 * 2 * 2.6e9
    assert cpu_spec_peak(zen5, "AuthenticAMD", 25, 2, 2600, torch.float32) == 2 * 16 * 2 * 1 * 2.6e9  # Zen 4
    assert cpu_spec_peak(("fma", "avx2"), "GenuineIntel", 6, 8, 3000, torch.float32) == 8 * 8 * 2 * 2 * 3e9
    assert cpu_spec_peak(("avx512f", "amx_bf16"), "GenuineIntel", 6, 4, 2000, torch.bfloat16) == 4 * 1024 * 2e9
    assert cpu_spec_peak(("fma", "avx2"), "GenuineIntel", 6, 8, 3000, torch.bfloat16) is None  # emulated bf16
    assert cpu_spec_peak(("asimd",), "ARM", None, 8, 3000, torch.float32) is None  # calibrate instead
    assert cpu_spec_peak(zen5, "AuthenticAMD", 26, 2, None, torch.float32) is None  # clock unreadable


def test_quick_measurements_are_not_trusted_and_busy_calibrations_are_refused():
    from portachat.device.flops import calibrate_peak

    save_calibration("Acc", torch.bfloat16, 1e12, "measured")  # a quick probe's figure, e.g. on a busy host
    assert cached_peak("Acc", torch.bfloat16) is None
    refused = calibrate_peak("Acc", torch.bfloat16, measure=lambda: 5e13, quick_probe=lambda: 9e13)
    assert refused.source.startswith("refused") and "doctor --calibrate" in refused.source
    assert cached_peak("Acc", torch.bfloat16) is None
    sweeps = iter([8e13, 1.2e14, 1.0e14])  # best of the rounds wins
    got = calibrate_peak("Acc", torch.bfloat16, measure=lambda: next(sweeps), quick_probe=lambda: 9e13)
    assert (got.value, got.source) == (1.2e14, "calibrated") and cached_peak("Acc", torch.bfloat16).value == 1.2e14
    lower = calibrate_peak("Acc", torch.bfloat16, measure=lambda: 1.0e14, quick_probe=lambda: 5e13)
    assert lower.value == 1.2e14  # a lower reading never replaces the ceiling


def test_uncalibrated_device_has_no_peak():
    from device_sim import ascend

    from portachat.device import Device

    dev = Device(ascend("Ascend999X", bf16=True))
    peak = dev.peak_flops(torch.bfloat16)
    assert peak.source == "uncalibrated" and peak.value != peak.value  # nan: MFU shows n/a
