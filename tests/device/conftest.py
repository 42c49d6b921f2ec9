from __future__ import annotations

import os

import pytest

from portachat.device import early_env, reset_device_cache

_VARS = (
    "PORTACHAT_DEVICE",
    "PORTACHAT_DTYPE",
    "PORTACHAT_COMPILE",
    "PORTACHAT_ATTENTION",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PORTACHAT_DIST_TIMEOUT",
    # the Ascend runtime defaults the device layer sets (a simulated NPU sets them in this process)
    "PYTORCH_NPU_ALLOC_CONF",
    "TASK_QUEUE_ENABLE",
    "CPU_AFFINITY_CONF",
    "HCCL_CONNECT_TIMEOUT",
    "HCCL_EXEC_TIMEOUT",
)


@pytest.fixture(autouse=True)
def clean_device_env(monkeypatch, tmp_path):
    """Each test sees no portachat/torchrun settings, a private home, and a fresh device cache; what the
    device layer writes into the environment is undone afterwards."""
    saved = dict(os.environ)
    for var in _VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PORTACHAT_HOME", str(tmp_path / "home"))
    early_env._SET_BY_US.clear()
    reset_device_cache()
    yield
    reset_device_cache()
    early_env._SET_BY_US.clear()
    os.environ.clear()
    os.environ.update(saved)
