"""TF32: a device decision (CUDA from compute capability 8.0), applied once when the device is built."""

from __future__ import annotations

import pytest
import torch
from device_sim import ascend, cpu, h100, v100

from portachat.device import Device
from portachat.device.policy import decide_tf32


def test_tf32_only_on_cuda_from_ampere():
    assert decide_tf32(h100()).value is True
    assert decide_tf32(v100()).value is False
    assert decide_tf32(ascend("Ascend910B3", bf16=True)).value is False
    assert decide_tf32(cpu()).value is False
    assert "8.0" in decide_tf32(v100()).reason


@pytest.fixture
def restored_precision():
    matmul, conv = torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision
    yield
    torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision = matmul, conv


def test_the_decision_is_applied_on_a_simulated_h100_and_not_on_the_cpu(restored_precision):
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    torch.backends.cudnn.conv.fp32_precision = "ieee"
    Device(cpu()).apply_math_settings()
    assert torch.backends.cuda.matmul.fp32_precision == "ieee"
    dev = Device(h100())
    assert dev.tf32 and "compute capability" in dev.tf32_reason
    dev.apply_math_settings()
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    assert torch.backends.cudnn.conv.fp32_precision == "tf32"
