from __future__ import annotations

import pytest
from device_sim import mps

from portachat.device import Device, DeviceError, dist_env, get_device, init_distributed


def test_dist_env_defaults_to_single_process():
    env = dist_env()
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (0, 0, 1, 1)
    assert env.is_main and not env.is_distributed


def test_dist_env_from_torchrun_vars(monkeypatch):
    for k, v in {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(k, v)
    env = dist_env()
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (3, 1, 4, 2)
    assert env.is_distributed and not env.is_main


def test_inconsistent_env_is_rejected(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "5")
    with pytest.raises(DeviceError, match="inconsistent"):
        dist_env()


def test_init_is_noop_for_single_process():
    assert init_distributed(get_device()).world_size == 1


def test_mps_refuses_multiple_processes(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(DeviceError, match="single process"):
        init_distributed(Device(mps()))


def test_missing_master_addr_is_explained(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(DeviceError, match="MASTER_ADDR"):
        init_distributed(get_device())
