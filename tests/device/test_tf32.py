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


NEW_API = hasattr(torch.backends.cuda.matmul, "fp32_precision")  # torch >= 2.9; older torch has the flags


def _tf32() -> tuple[bool, bool]:
    """(matmul, conv) on TF32, through whichever API this torch has."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    if NEW_API:
        return matmul.fp32_precision == "tf32", cudnn.conv.fp32_precision == "tf32"
    return bool(matmul.allow_tf32), bool(cudnn.allow_tf32)


def _set_ieee() -> None:
    if NEW_API:
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.conv.fp32_precision = "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


@pytest.fixture
def restored_precision():
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = (matmul.fp32_precision, cudnn.conv.fp32_precision) if NEW_API else (matmul.allow_tf32, cudnn.allow_tf32)
    yield
    if NEW_API:
        matmul.fp32_precision, cudnn.conv.fp32_precision = saved
    else:
        matmul.allow_tf32, cudnn.allow_tf32 = saved


def test_the_decision_is_applied_on_a_simulated_h100_and_not_on_the_cpu(restored_precision):
    _set_ieee()
    Device(cpu()).apply_math_settings()
    assert _tf32() == (False, False)
    dev = Device(h100())
    assert dev.tf32 and "compute capability" in dev.tf32_reason
    dev.apply_math_settings()
    assert _tf32() == (True, True)
