from __future__ import annotations

import pytest

from portachat.device import reset_device_cache

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
)


@pytest.fixture(autouse=True)
def clean_device_env(monkeypatch, tmp_path):
    """Each test sees no portachat/torchrun settings, a private home, and a fresh device cache."""
    for var in _VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PORTACHAT_HOME", str(tmp_path / "home"))
    reset_device_cache()
    yield
    reset_device_cache()
