"""An Atlas A2 as the device layer sees it, its tensors on the CPU: with a stand-in torch_npu
(torch_npu_standin.py) installed, fast_path.enabled answers for CPU tensors as on that Ascend."""

from __future__ import annotations

import torch

from portachat.device.device import Device
from portachat.ops import fast_path
from tests.device.device_sim import ascend


class CpuBackedAscend(Device):
    """An Atlas A2's facts and decisions, its tensors on the CPU for the stand-in kernels."""

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def type(self) -> str:
        return "cpu"

    @type.setter
    def type(self, _value: str) -> None:
        pass


def ascend_a2(dtype: str = "fp32") -> CpuBackedAscend:
    return CpuBackedAscend(ascend("Ascend910B3", bf16=True), dtype=dtype)


def on_ascend(monkeypatch, dev: Device) -> None:
    """Route fast_path.enabled's device lookup for CPU tensors to the simulated Ascend, as a new process
    would find it (answers given for the CPU so far are forgotten)."""
    monkeypatch.setattr(fast_path, "device_holding", lambda where: dev)
    fast_path.forget_all()
