"""The data-parallel sync check sums the weights' bits as integers (exact, no float64 on the device)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from portachat.train.replicas import bits, check_replicas_in_sync


def test_bit_sums_see_one_ulp_and_every_dtype():
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        w = torch.randn(64, 32, generator=torch.Generator().manual_seed(0)).to(dtype)
        nudged = w.clone()
        bits(nudged)[3, 5] += 1  # one unit in the last place
        assert not torch.equal(w, nudged)
        assert bits(w).sum(dtype=torch.int64) == bits(w.clone()).sum(dtype=torch.int64)
        assert bits(w).sum(dtype=torch.int64) != bits(nudged).sum(dtype=torch.int64)
        assert bits(w).dtype.is_floating_point is False


def test_sync_check_runs_in_a_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        said = []
        check_replicas_in_sync(torch.nn.Linear(8, 4).to(torch.bfloat16), 1, said.append)
        assert said and "weights identical on all 1 ranks (checksum " in said[0]
    finally:
        dist.destroy_process_group()
