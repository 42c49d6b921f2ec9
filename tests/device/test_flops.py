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
