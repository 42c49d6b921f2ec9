"""Two real processes joining a gloo group through init_distributed, as torchrun would start them."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, results) -> None:
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "PORTACHAT_DEVICE": "cpu",
        }
    )
    import torch.distributed as dist

    from portachat.device import destroy_distributed, get_device, init_distributed

    env = init_distributed(get_device(), timeout_s=60)
    assert init_distributed(get_device()).world_size == world  # idempotent
    t = torch.tensor([float(env.rank + 1)])
    dist.all_reduce(t)
    results[rank] = t.item()
    destroy_distributed()


@pytest.mark.slow
def test_two_process_gloo_all_reduce():
    world = 2
    results = mp.Manager().dict()
    mp.spawn(_worker, args=(world, _free_port(), results), nprocs=world, join=True)
    assert dict(results) == {0: 3.0, 1: 3.0}
