"""PrefetchStream: same batches as the wrapped loader, exact resume at the consumed position, and
the step no longer waits on the loader."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from data_helpers import ByteTokenizer, numbered_docs, write_jsonl

from portachat.data.loader import PackedLoader
from portachat.data.prefetch import PrefetchStream
from portachat.data.sources import open_source
from portachat.device import get_device


@pytest.fixture
def source(tmp_path):
    return open_source(write_jsonl(tmp_path / "docs.jsonl", numbered_docs(400)))


def loader(source) -> PackedLoader:
    return PackedLoader(source, ByteTokenizer(), batch_size=4, seq_len=48, tokenizer_batch_docs=8, buffer_docs=16)


def batches(stream, n: int) -> list[torch.Tensor]:
    return [torch.cat(stream.next_batch(), dim=1) for _ in range(n)]


def test_same_batches_as_the_loader(source):
    want = batches(loader(source), 12)
    with PrefetchStream(loader(source), depth=3) as pre:
        got = batches(pre, 12)
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))


def test_resume_is_exact_at_the_consumed_position(source):
    want = batches(loader(source), 20)
    pre = PrefetchStream(loader(source), depth=4)
    first = batches(pre, 7)
    deadline = time.time() + 10
    while pre._queue.qsize() < 4 and time.time() < deadline:  # let the producer run ahead of the step
        time.sleep(0.01)
    state = pre.state_dict()
    assert state["batches"] == 7  # consumed, not produced
    pre.close()
    resumed = PrefetchStream(loader(source), depth=4)
    resumed.load_state_dict(state)
    rest = batches(resumed, 13)
    resumed.close()
    assert all(torch.equal(a, b) for a, b in zip(want, first + rest, strict=True))
    again = batches(pre, 3)  # a closed stream restarts where its consumer stopped, losing nothing
    pre.close()
    assert all(torch.equal(a, b) for a, b in zip(want[7:10], again, strict=True))


class SlowStream:
    """A real loader plus the cost of a heavier tokenizer (5 ms a batch)."""

    def __init__(self, inner: PackedLoader) -> None:
        self.inner = inner

    def next_batch(self):
        time.sleep(0.005)
        return self.inner.next_batch()

    def state_dict(self):
        return self.inner.state_dict()

    def load_state_dict(self, state):
        self.inner.load_state_dict(state)


def test_step_does_not_wait_on_the_loader(source):
    pre = PrefetchStream(SlowStream(loader(source)), depth=2, device=get_device("cpu"))
    for _ in range(10):
        pre.next_batch()
        time.sleep(0.05)  # the step: meanwhile the next batch is made
    pre.close()
    assert pre.waits <= 1  # only the very first batch had to be waited for


def test_end_of_data_and_errors_reach_the_consumer(source):
    class Failing(SlowStream):
        def next_batch(self):
            if self.inner.batches >= 3:
                raise ValueError("broken shard")
            return self.inner.next_batch()

    pre = PrefetchStream(Failing(loader(source)))
    batches(pre, 3)
    with pytest.raises(ValueError, match="broken shard"):
        pre.next_batch()
    with pytest.raises(ValueError):
        pre.next_batch()
    assert pre.state_dict()["batches"] == 3


class _SlowCounter:
    """A stream whose every batch takes 30 ms to make."""

    def __init__(self) -> None:
        self.pos = 0

    def next_batch(self):
        time.sleep(0.03)
        self.pos += 1
        return torch.tensor([self.pos]), torch.tensor([self.pos])

    def state_dict(self) -> dict:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.pos = state["pos"]


def test_waits_for_the_loader_are_counted_and_timed():
    with PrefetchStream(_SlowCounter(), depth=1) as stream:
        stream.next_batch()  # nothing is ready yet: the consumer waits for the first batch
        assert stream.waits == 1 and stream.wait_s >= 0.02
        time.sleep(0.1)  # the producer catches up: the next batch is ready, no wait
        waited = stream.wait_s
        stream.next_batch()
        assert stream.waits == 1 and stream.wait_s == waited


def test_the_producer_thread_sets_its_ranks_device_before_pinning():
    """A new thread's current device is card 0: pinning there would open a context on card 0 for every rank."""
    events = []

    class RankDevice:  # the Device calls the producer makes, recording the thread they run on
        torch_device = torch.device("cpu")

        def set_current(self):
            events.append(("set_current", threading.current_thread().name))

        def pin(self, t):
            events.append(("pin", threading.current_thread().name))
            return t

    with PrefetchStream(_SlowCounter(), depth=1, device=RankDevice()) as stream:
        stream.next_batch()
    assert events[0] == ("set_current", "portachat-prefetch") and events[1][0] == "pin"
    assert events.count(("set_current", "portachat-prefetch")) == 1
