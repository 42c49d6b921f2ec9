"""The weights' inference dtype: the device's compute dtype on accelerators, measured once on a CPU."""

from __future__ import annotations

import json

import pytest
import torch

from portachat.device import Device, get_device
from portachat.device.dtypes import parse_dtype
from portachat.ops import inference_dtype as infd
from tests.device.device_sim import ascend, h100, v100


@pytest.mark.parametrize(
    "facts, expected",
    [(h100(), torch.bfloat16), (v100(), torch.float16), (ascend("Ascend910A", bf16=False), torch.float16)],
)
def test_accelerators_infer_in_their_compute_dtype(facts, expected):
    assert infd.inference_dtype(Device(facts)).value == expected


def test_requested_dtype_wins_and_bad_names_are_refused(monkeypatch):
    dev = Device(h100())
    assert infd.inference_dtype(dev, "fp32").value == torch.float32
    monkeypatch.setenv("PORTACHAT_INFERENCE_DTYPE", "float16")
    assert infd.inference_dtype(dev).value == torch.float16
    with pytest.raises(ValueError, match="fp32, bf16, fp16"):
        parse_dtype("bf17")


def test_cpu_dtype_is_measured_once_and_cached_on_disk(monkeypatch, tmp_path):
    calls = []
    real = infd.measure_cpu_matvec

    def counted(dtype, **kw):
        calls.append(dtype)
        return real(dtype, rows=256, cols=256, reps=2)

    monkeypatch.setattr(infd, "measure_cpu_matvec", counted)
    monkeypatch.setattr(infd, "_memo", {})
    first = infd.inference_dtype(get_device("cpu"))
    assert first.value in (torch.float32, torch.bfloat16) and "measured" in first.reason
    assert sorted(map(str, calls)) == ["torch.bfloat16"] * 3 + ["torch.float32"] * 3  # alternating, best of 3
    saved = json.loads((tmp_path / "home" / "inference_dtype.json").read_text())
    assert list(saved.values()) == [{torch.float32: "fp32", torch.bfloat16: "bf16"}[first.value]]
    monkeypatch.setattr(infd, "_memo", {})  # a new process: reads the file, measures nothing
    assert infd.inference_dtype(get_device("cpu")).value == first.value and len(calls) == 6
