"""Concurrent embedding requests share forwards: a worker thread takes every request waiting, embeds
their inputs together (one Embedder.embed_ids per `dimensions` value) and hands each request its rows.
Many small requests (one text each, as chat front-ends and indexers send them) then cost a few
large batches instead of one small forward each."""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from portachat.engine.embeddings.embedder import Embedder


@dataclass
class _Request:
    ids: list[list[int]]
    dimensions: int | None
    future: Future = field(default_factory=Future)


class EmbeddingQueue:
    def __init__(self, embedder: Embedder, start: bool = True) -> None:
        self.embedder = embedder
        self._waiting: queue.Queue[_Request | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="portachat-embeddings", daemon=True)
        self.batches_run = 0  # embed_ids calls so far (what coalescing saves shows here)
        if start:
            self.start()

    def start(self) -> None:
        self._thread.start()

    def submit(self, ids: list[list[int]], dimensions: int | None = None) -> Future:
        """A future of the [len(ids), dim] vectors. Check inputs first (Embedder.check_inputs): an error
        here fails every request embedded in the same batch."""
        request = _Request(ids, dimensions)
        self._waiting.put(request)
        return request.future

    def close(self) -> None:
        self._waiting.put(None)

    def _run(self) -> None:
        while True:
            first = self._waiting.get()
            if first is None:
                return
            batch = [first]
            while True:  # everything that arrived meanwhile joins this round
                try:
                    item = self._waiting.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._waiting.put(None)  # finish this round, then stop
                    break
                batch.append(item)
            for dims in {r.dimensions for r in batch}:
                self._embed([r for r in batch if r.dimensions == dims], dims)

    def _embed(self, requests: list[_Request], dimensions: int | None) -> None:
        live = [r for r in requests if r.future.set_running_or_notify_cancel()]
        if not live:
            return
        try:
            vectors = self.embedder.embed_ids([ids for r in live for ids in r.ids], dimensions)
            self.batches_run += 1
        except BaseException as exc:  # noqa: BLE001 - each waiting request gets the failure
            for r in live:
                r.future.set_exception(exc)
            return
        rows = torch.split(vectors, [len(r.ids) for r in live])
        for r, part in zip(live, rows, strict=True):
            r.future.set_result(part)
