"""Muon's Newton-Schulz split across two real gloo processes: each rank orthogonalises its share,
the ranks end bit-identical, and the result matches one process doing all the work."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from portachat.train.muon_split import share

SHAPES = [(24, 16)] * 3 + [(16, 40)] * 2 + [(8, 8)]  # 3 and 2 same-shape matrices, and a single one


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _params() -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(shape, generator=g)) for shape in SHAPES]


def _run_steps(params: list[torch.nn.Parameter], split: bool, steps: int = 3) -> list[torch.Tensor]:
    from portachat.train.optim import Muon

    opt = Muon(params, lr=0.05, ns_dtype=torch.float32, split_across_ranks=split)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p in params:  # the same averaged gradient on every rank, as after DDP's all-reduce
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()
    return [p.detach().clone() for p in params]


def _worker(rank: int, world: int, port: int, results) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PORTACHAT_DEVICE="cpu")
    torch.set_num_threads(1)
    import torch.distributed as dist

    import portachat.train.optim as optim
    from portachat.device import destroy_distributed, get_device, init_distributed

    init_distributed(get_device(), timeout_s=60)
    done = {"matrices": 0}
    real = optim.newton_schulz

    def counting(x, *args, **kwargs):
        done["matrices"] += x.size(0)
        return real(x, *args, **kwargs)

    optim.newton_schulz = counting
    split = _run_steps(_params(), split=True)
    split_work = done["matrices"]
    done["matrices"] = 0
    alone = _run_steps(_params(), split=False)  # what every rank computes when it does all the work
    optim.newton_schulz = real

    flat = torch.cat([p.flatten() for p in split])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    results[rank] = {
        "identical": all(torch.equal(gathered[0], x) for x in gathered),
        "max_diff_vs_alone": max((a - b).abs().max().item() for a, b in zip(split, alone, strict=True)),
        "split_work": split_work,
        "alone_work": done["matrices"],
    }
    destroy_distributed()


def test_share_covers_every_matrix_once():
    for n in range(1, 9):
        for world in (1, 2, 3, 4):
            covered = [i for r in range(world) for i in range(*share(n, world, r))]
            assert covered == list(range(n)), (n, world)


@pytest.mark.slow
def test_newton_schulz_split_across_two_ranks_is_exact():
    world = 2
    results = mp.Manager().dict()
    mp.spawn(_worker, args=(world, _free_port(), results), nprocs=world, join=True)
    r0, r1 = results[0], results[1]
    assert r0["identical"] and r1["identical"]
    assert r0["max_diff_vs_alone"] < 1e-6 and r1["max_diff_vs_alone"] < 1e-6
    steps = 3
    assert r0["alone_work"] == r1["alone_work"] == steps * len(SHAPES)
    # 3 matrices -> 2 + 1, 2 -> 1 + 1, the single (8, 8) matrix on both ranks (cheaper than a collective)
    assert r0["split_work"] == steps * (2 + 1 + 1) and r1["split_work"] == steps * (1 + 1 + 1)
