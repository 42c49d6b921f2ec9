"""Training defaults and prices are product policy in speedrun/presets.py, decided by whether an
accelerator does the work (a device fact)."""

from __future__ import annotations

from portachat.device import Device, get_device
from portachat.speedrun.presets import price_per_device_hour, training_defaults
from tests.device.device_sim import ascend, h100


def test_accelerators_get_the_gpu_sizes_and_price():
    for facts in (h100(), ascend("Ascend910B3", bf16=True)):
        dev = Device(facts)
        assert training_defaults(dev).depth == 20 and training_defaults(dev).max_seq_len == 2048
        assert training_defaults(dev).rl_groups_per_row_batch == 4
        assert price_per_device_hour(dev) == 2.0


def test_the_cpu_gets_laptop_sizes_and_price():
    dev = get_device("cpu")
    assert (training_defaults(dev).depth, training_defaults(dev).device_batch_size) == (4, 4)
    assert price_per_device_hour(dev) == 0.05
