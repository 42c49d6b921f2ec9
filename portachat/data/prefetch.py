"""Run the input pipeline ahead of the training step: tokenizing and packing on a background thread.

`PrefetchStream` wraps any BatchStream (next_batch / state_dict / load_state_dict). A thread keeps a
bounded queue of ready batches (in pinned memory on accelerators, so the copy to the device is
asynchronous), while the step computes. The tokenizer releases the GIL, so the two overlap.

Resume stays exact: every queued batch carries the position of the wrapped stream right after it, and
`state_dict()` returns the position after the last batch CONSUMED, not the last one produced, so the
batches sitting in the queue are produced again after a restart.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Protocol

import torch


class BatchStream(Protocol):
    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...


class _End:
    """Queued in place of a batch when the wrapped stream raised (StopIteration included)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class PrefetchStream:
    def __init__(self, stream: BatchStream, depth: int = 2, device: Any = None) -> None:
        """`depth`: batches made ahead. `device`: a portachat Device; batches are pinned for it and
        moved to it with non_blocking=True (None: batches stay on the host as the stream made them)."""
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        self.stream = stream
        self.depth = depth
        self.device = device
        self.waits = 0  # how often the step found no batch ready (it then waited on the loader)
        self.wait_s = 0.0  # seconds the step spent waiting for those batches
        self._consumed_state = stream.state_dict()
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ended: _End | None = None
        self._rewind = False  # after close(): batches made ahead were dropped, restart from the consumed position

    # --- producer ---------------------------------------------------------------------------------
    def _produce(self) -> None:
        try:  # a new thread starts on device 0: pin for this rank's device, not card 0's
            if self.device is not None:
                self.device.set_current()
        except BaseException as e:  # handed to the consumer, raised there
            self._queue.put(_End(e))
            return
        while not self._stop.is_set():
            try:
                inputs, targets = self.stream.next_batch()
                if self.device is not None:
                    inputs, targets = self.device.pin(inputs), self.device.pin(targets)
                item: Any = ((inputs, targets), self.stream.state_dict())
            except BaseException as e:  # handed to the consumer, raised there
                item = _End(e)
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if isinstance(item, _End):
                return

    def _start(self) -> None:
        if self._thread is None and self._ended is None:
            if self._rewind:
                self.stream.load_state_dict(self._consumed_state)
                self._rewind = False
            self._stop.clear()
            self._thread = threading.Thread(target=self._produce, name="portachat-prefetch", daemon=True)
            self._thread.start()

    # --- consumer ---------------------------------------------------------------------------------
    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._ended is not None:
            raise self._ended.error
        self._start()
        if self._queue.empty():
            self.waits += 1
            start = time.perf_counter()
            item = self._queue.get()
            self.wait_s += time.perf_counter() - start
        else:
            item = self._queue.get()
        if isinstance(item, _End):
            self._ended = item
            self._thread = None
            raise item.error
        (inputs, targets), self._consumed_state = item
        if self.device is not None:
            target_device = self.device.torch_device
            inputs = inputs.to(target_device, non_blocking=True)
            targets = targets.to(target_device, non_blocking=True)
        return inputs, targets

    def __iter__(self):
        while True:
            try:
                yield self.next_batch()
            except StopIteration:
                return

    def state_dict(self) -> dict:
        """The wrapped stream's position after the last batch this wrapper handed out."""
        return self._consumed_state

    def load_state_dict(self, state: dict) -> None:
        self.close()
        self.stream.load_state_dict(state)
        self._consumed_state = self.stream.state_dict()
        self._ended = None
        self._rewind = False

    def close(self) -> None:
        """Stop the producer and drop what it made ahead (state_dict() still says what was consumed)."""
        self._stop.set()
        while self._thread is not None and self._thread.is_alive():
            try:
                while True:
                    self._queue.get_nowait()
            except queue.Empty:
                pass
            self._thread.join(timeout=0.1)
        if self._thread is not None:
            self._rewind = True
        self._thread = None
        self._queue = queue.Queue(maxsize=self.depth)
        self._stop.clear()

    def __enter__(self) -> PrefetchStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
