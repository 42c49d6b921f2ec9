"""The SDPA kernel training attention prefers: measured once on the device (a fake timer here, on
simulated probes), cached like the calibrated peak, applied as torch's priority order; on a CPU there
is nothing to choose."""

from __future__ import annotations

import pytest
import torch
from device_sim import cpu, h100
from torch.nn.attention import SDPBackend

from portachat.device import Device
from portachat.device.attention_choice import (
    CANDIDATES,
    _attention_step,
    choose_attention_kernel,
    prefer_attention_kernel,
)

SHAPE = (8, 12, 4, 2048, 128)


def fake_timer(ms: dict[str, float], calls: list[str]):
    def timer(name, _fn):
        calls.append(name)
        if ms.get(name) is None:
            raise RuntimeError(f"No available kernel: {name}")
        return ms[name] / 1000
    return timer


def test_the_fastest_candidate_is_chosen_once_then_read_from_the_cache():
    dev = Device(h100())
    calls: list[str] = []
    choice = choose_attention_kernel(dev, SHAPE, torch.bfloat16, fake_timer({"flash": 2.0, "cudnn": 1.0,
                                                                              "efficient": 3.0}, calls))
    assert choice.value == "cudnn" and "fastest measured" in choice.reason and sorted(calls) == sorted(CANDIDATES)
    again = choose_attention_kernel(dev, SHAPE, torch.bfloat16, fake_timer({}, calls))
    assert again.value == "cudnn" and "cached" in again.reason and len(calls) == 3
    other = choose_attention_kernel(dev, (8, 12, 4, 1024, 128), torch.bfloat16, fake_timer({"flash": 1.0}, calls))
    assert other.value == "flash"  # another shape is measured on its own


def test_kernels_that_cannot_run_are_no_candidates():
    dev = Device(h100())
    assert choose_attention_kernel(dev, SHAPE, torch.bfloat16, fake_timer({"flash": 2.0, "efficient": 3.0}, [])).value == "flash"
    assert choose_attention_kernel(dev, (1, 1, 1, 8, 8), torch.bfloat16, fake_timer({}, [])).value is None


def test_nothing_is_measured_on_a_cpu():
    calls: list[str] = []
    choice = choose_attention_kernel(Device(cpu()), SHAPE, torch.float32, fake_timer({"flash": 1.0}, calls))
    assert choice.value is None and calls == []


def test_an_unsupported_kernel_raises_what_the_measurement_skips():
    dev = Device(cpu())
    state = torch.get_rng_state()
    # (heads = kv heads: CPU flash takes enable_gqa only from torch 2.7 on)
    _attention_step(dev, (1, 2, 2, 16, 8), torch.float32, SDPBackend.FLASH_ATTENTION)()  # the CPU has flash
    assert torch.equal(torch.get_rng_state(), state)  # the run's random stream is left alone
    with pytest.raises(RuntimeError):
        _attention_step(dev, (1, 2, 2, 16, 8), torch.float32, SDPBackend.EFFICIENT_ATTENTION)()


def test_the_choice_goes_first_in_the_priority_order_with_every_kernel_still_enabled():
    before = torch._C._get_sdp_priority_order()
    try:
        prefer_attention_kernel("cudnn")
        assert torch._C._get_sdp_priority_order()[0] == int(SDPBackend.CUDNN_ATTENTION)
        assert all(f() for f in (torch.backends.cuda.flash_sdp_enabled, torch.backends.cuda.mem_efficient_sdp_enabled,
                                 torch.backends.cuda.math_sdp_enabled, torch.backends.cuda.cudnn_sdp_enabled))
        q = torch.randn(1, 2, 16, 8)
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)  # still runs where cuDNN cannot
    finally:
        prefer_attention_kernel(None)
    assert torch._C._get_sdp_priority_order() == before
