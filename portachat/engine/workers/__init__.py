"""Engines spread over devices: tensor-parallel shards of one model in worker processes driven by
rank 0, and data-parallel replicas behind one front."""

from portachat.engine.workers.data_parallel import DataParallelEngine, async_engine_for
from portachat.engine.workers.group import WorkerFailure, WorkerGroup, start_workers

__all__ = ["DataParallelEngine", "WorkerFailure", "WorkerGroup", "async_engine_for", "start_workers"]
