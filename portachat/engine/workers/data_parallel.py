"""Data parallelism: D engine replicas (one per device) behind the interface of one AsyncEngine.

Each replica runs its own scheduler and KV cache on its own thread; a new request goes to the
replica with the least work (requests in flight, then KV-cache use), so an 8-card node serves a
small model about 8x as fast as one card. The server, the registry and the metrics see one engine:
counters add up naturally (every replica reports to the same model's observer), and the gauges
(running, waiting, KV use) are combined here before they reach the metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from portachat.engine.async_engine import (
    AsyncEngine,
    EngineLike,
    RequestObserver,
    RequestStream,
    RequestTiming,
)
from portachat.engine.types import RequestOutput, SamplingParams


class _ReplicaObserver:
    """One replica's view of the model's observer: outputs pass through, stats are combined."""

    def __init__(self, front: DataParallelEngine, index: int, observer: RequestObserver | None) -> None:
        self.front, self.index, self.observer = front, index, observer

    def on_output(self, request: RequestTiming, output: RequestOutput, now: float) -> None:
        if self.observer is not None:
            self.observer.on_output(request, output, now)

    def on_stats(self, stats: dict) -> None:
        self.front.replica_stats[self.index] = stats
        if self.observer is not None:
            self.observer.on_stats(self.front.stats())


class DataParallelEngine:
    """D AsyncEngines that answer as one (the methods the server uses)."""

    def __init__(self, engines: list[EngineLike], observer: RequestObserver | None = None) -> None:
        if not engines:
            raise ValueError("data parallelism needs at least one engine")
        self.replica_stats: list[dict] = [{} for _ in engines]
        self.replicas = [AsyncEngine(e, observer=_ReplicaObserver(self, i, observer)) for i, e in enumerate(engines)]
        self.requests_per_replica = [0] * len(engines)
        self._adding = [0] * len(engines)  # submitted, not yet accepted

    def _least_loaded(self) -> int:
        def load(i: int) -> tuple[int, float]:
            replica = self.replicas[i]
            return replica.num_in_flight() + self._adding[i], float(replica.stats().get("kv_cache_usage", 0.0))

        return min((i for i, r in enumerate(self.replicas) if r.is_alive), key=load, default=0)

    async def add(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None) -> RequestStream:
        i = self._least_loaded()
        # Counted from now: a burst of requests arrives before any is accepted (num_in_flight grows
        # only then), and must still spread over the replicas.
        self._adding[i] += 1
        try:
            handle = await self.replicas[i].add(prompt_ids, params, request_id)
        finally:
            self._adding[i] -= 1
        self.requests_per_replica[i] += 1
        return handle

    async def call(self, fn: Callable[[EngineLike], Any]) -> list[Any]:
        """`fn(engine)` on every replica's engine thread (e.g. adding a LoRA adapter to each)."""
        return [await r.call(fn) for r in self.replicas]

    def stop_accepting(self) -> None:
        for r in self.replicas:
            r.stop_accepting()

    def abort_all(self) -> None:
        for r in self.replicas:
            r.abort_all()

    async def drain(self, timeout_s: float) -> bool:
        results = [await r.drain(timeout_s) for r in self.replicas]  # the first wait covers most of the rest
        return all(results)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        for r in self.replicas:
            r.stop_accepting()
        for r in self.replicas:
            r.shutdown(timeout_s)

    def stats(self) -> dict:
        """Running and waiting summed; KV use as the mean over replicas (each holds its own cache)."""
        stats = [r.stats() for r in self.replicas]
        out = {
            "num_running": sum(s.get("num_running", 0) for s in stats),
            "num_waiting": sum(s.get("num_waiting", 0) for s in stats),
            "kv_cache_usage": sum(s.get("kv_cache_usage", 0.0) for s in stats) / len(stats),
            "data_parallel_size": len(stats),
        }
        for key in ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens"):
            if any(key in s for s in stats):
                out[key] = sum(s.get(key, 0) for s in stats)
        per_pos = [s.get("spec_decode_num_accepted_tokens_per_pos", []) for s in stats]
        if any(per_pos):
            out["spec_decode_num_accepted_tokens_per_pos"] = [
                sum(p[i] for p in per_pos if i < len(p)) for i in range(max(len(p) for p in per_pos))]
        return out

    def num_in_flight(self) -> int:
        return sum(r.num_in_flight() for r in self.replicas)

    @property
    def is_alive(self) -> bool:
        return all(r.is_alive for r in self.replicas)


def async_engine_for(served: Any, observer: RequestObserver | None) -> AsyncEngine | DataParallelEngine:
    """The engine front for a loaded model: its one engine, or all its replicas as one."""
    replicas = list(getattr(served, "replicas", None) or [])
    if not replicas:
        return AsyncEngine(served.engine, observer=observer)
    return DataParallelEngine([served.engine, *replicas], observer=observer)
