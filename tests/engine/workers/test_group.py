"""Where the tensor-parallel workers of D replicas sit: global rank -> (replica, rank) -> device index."""

from __future__ import annotations

from portachat.device.dist import shard_device_index
from portachat.engine.workers.group import worker_place


def test_one_replica_keeps_rank_equal_to_device():
    assert [worker_place(g, 4) for g in (1, 2, 3)] == [(0, 1), (0, 2), (0, 3)]
    assert [shard_device_index(0, r, 4) for r in range(4)] == [0, 1, 2, 3]


def test_replicas_of_split_models_use_every_device_once():
    tp, dp = 3, 2
    workers = [worker_place(g, tp) for g in range(1, 1 + dp * (tp - 1))]
    assert workers == [(0, 1), (0, 2), (1, 1), (1, 2)]
    devices = [shard_device_index(i, 0, tp) for i in range(dp)]  # rank 0's shards
    devices += [shard_device_index(i, r, tp) for i, r in workers]
    assert sorted(devices) == list(range(tp * dp))
