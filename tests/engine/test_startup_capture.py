"""Decode graphs captured at engine start-up under one process-wide lock in thread-local mode, and the
KV budget taken after the start-up profile. Capture needs an accelerator: here the device layer's graph
API is a fake module that records every call (the captured callables still run, on the CPU)."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
import torch
from engine_testing import make_engine, tiny_model

from portachat.device import graphs as graphs_mod
from portachat.device.graphs import CAPTURE_LOCK, GraphCapturer, capture_mode_kwargs
from portachat.device.memory import MemoryStats
from portachat.engine import EngineConfig, SamplingParams
from portachat.engine.decode_graphs import DecodeGraphs, block_buckets, padded_blocks
from portachat.engine.startup_memory import profiled_kv_budget
from portachat.ops.fast_path import set_enabled

GiB = 2**30


class FakeGraphs:
    """Stands in for torch.cuda: CUDAGraph, graph(), graph_pool_handle and the stream calls."""

    def __init__(self, hold_s: float = 0.0) -> None:
        self.captures: list[dict] = []
        self.in_capture = 0
        self.most_at_once = 0
        self.hold_s = hold_s
        self.on_capture = lambda: None

    class CUDAGraph:
        def replay(self) -> None:
            pass

    def graph_pool_handle(self):
        return ("pool", id(self))

    def Stream(self):  # noqa: N802 - the vendor's name
        return self

    def wait_stream(self, _other) -> None:
        pass

    def current_stream(self):
        return self

    def stream(self, _s):
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def graph(self, graph, pool=None, stream=None, capture_error_mode: str = "global"):
        self.in_capture += 1
        self.most_at_once = max(self.most_at_once, self.in_capture)
        held_elsewhere = _lock_is_held_by_us()
        self.captures.append({"mode": capture_error_mode, "pool": pool, "locked": held_elsewhere})
        time.sleep(self.hold_s)
        try:
            yield
        finally:
            self.in_capture -= 1
            self.on_capture()


def _lock_is_held_by_us() -> bool:
    """True when the process-wide capture lock is held (by the capturing thread): another thread
    cannot take it."""
    got = []
    probe = threading.Thread(target=lambda: got.append(CAPTURE_LOCK.acquire(blocking=False)))
    probe.start()
    probe.join()
    if got[0]:
        CAPTURE_LOCK.release()
    return not got[0]


@pytest.fixture
def fake_cuda(monkeypatch) -> FakeGraphs:
    fake = FakeGraphs()
    monkeypatch.setattr(graphs_mod, "device_module", lambda t: fake if t == "cuda" else None)
    set_enabled("decode_graphs", "cpu", True)  # as if the self-test passed: this fake records, it does not replay
    yield fake
    set_enabled("decode_graphs", "cpu", None)


def test_every_bucket_is_captured_when_the_engine_starts_under_the_lock_in_thread_local_mode(
    chat_tokenizer, fake_cuda
):
    model = tiny_model(chat_tokenizer.vocab_size, seed=2, architecture="llama", qk_norm=False)
    engine = make_engine(chat_tokenizer, model=model, max_num_seqs=8, max_model_len=64)
    engine.runner.enable_decode_graphs(8, GraphCapturer("cuda"))
    graphs = engine.runner.graphs
    widths = block_buckets(4, 16)  # block_size 4, 64 tokens: every padded width
    assert widths == sorted({padded_blocks(n, 4, 16) for n in range(1, 65)})
    assert set(graphs.graphs) == {(b, w) for b in (1, 2, 4, 8) for w in widths}
    assert graphs.all_buckets()[0] == (8, 16)  # largest first: the shared pool is sized once
    assert len(fake_cuda.captures) == len(graphs.graphs)
    assert all(c["mode"] == "thread_local" and c["locked"] for c in fake_cuda.captures)
    assert len({c["pool"] for c in fake_cuda.captures}) == 1
    before = len(fake_cuda.captures)
    engine.generate([[5, 6, 7]], SamplingParams(max_tokens=3, temperature=0.0))  # serving replays; it never captures
    assert len(fake_cuda.captures) == before


def test_engines_starting_in_threads_capture_one_at_a_time(chat_tokenizer, fake_cuda):
    fake_cuda.hold_s = 0.002
    engines = [make_engine(chat_tokenizer, model=tiny_model(chat_tokenizer.vocab_size, seed=s, architecture="llama",
                                                            qk_norm=False), max_num_seqs=4, max_model_len=32)
               for s in (1, 2)]  # fmt: skip
    threads = [threading.Thread(target=e.runner.enable_decode_graphs, args=(4, GraphCapturer("cuda")))
               for e in engines]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(e.runner.graphs.replays and e.runner.graphs.graphs for e in engines)
    assert fake_cuda.most_at_once == 1


def test_a_failed_start_up_capture_leaves_the_engine_eager(chat_tokenizer, fake_cuda):
    def fail():
        raise RuntimeError("operation not permitted when stream is capturing")

    fake_cuda.on_capture = fail
    engine = make_engine(chat_tokenizer, model=tiny_model(chat_tokenizer.vocab_size, architecture="llama",
                                                          qk_norm=False), max_num_seqs=4, max_model_len=32)
    with pytest.warns(UserWarning, match="continuing eager"):
        engine.runner.enable_decode_graphs(4, GraphCapturer("cuda"))
    assert not engine.runner.graphs.replays and engine.runner.graphs.graphs == {}


def test_capture_mode_is_passed_only_where_the_vendor_takes_it():
    def old_port(graph, pool=None):
        pass

    assert capture_mode_kwargs(torch.cuda.graph) == {"capture_error_mode": "thread_local"}
    assert capture_mode_kwargs(old_port) == {}


class SimulatedGpu:
    """A device whose memory the test decides: 80 GiB, 10 GiB in use; each captured graph's pool
    takes 2 GiB, and a forward since the last peak reset reaches 3 GiB above what is allocated."""

    type = kind = "cuda"
    allocator_tracks_peaks = True
    torch_device = torch.device("cpu")

    def __init__(self, fake: FakeGraphs) -> None:
        self.used = 10 * GiB
        self.forward_since_reset = False
        self.events: list[str] = []
        fake.on_capture = self._captured

    def _captured(self) -> None:
        self.used += 2 * GiB
        self.events.append("capture")

    def forward(self) -> None:
        self.forward_since_reset = True
        self.events.append("forward")

    def memory(self) -> MemoryStats:
        self.events.append("memory")
        peak = self.used + (3 * GiB if self.forward_since_reset else 0)
        return MemoryStats(self.used, peak, self.used, 80 * GiB - self.used, 80 * GiB)

    def reset_peak_memory(self) -> None:
        self.forward_since_reset = False

    def empty_cache(self) -> None:
        pass

    def synchronize(self) -> None:
        pass


def test_the_kv_budget_is_taken_after_the_profile_step_and_the_capture(fake_cuda):
    dev = SimulatedGpu(fake_cuda)
    model = tiny_model(300, seed=3, architecture="llama", qk_norm=False)
    shapes = []
    def seen(_module, inp, _out) -> None:
        dev.forward()
        shapes.append(tuple(inp[0].shape))

    model.lm_head.register_forward_hook(seen)
    config = EngineConfig(max_num_seqs=300, block_size=16, max_model_len=256, gpu_memory_utilization=0.9)
    wanted = 100 * GiB  # more than fits: the budget decides
    choice = profiled_kv_budget(dev, model, config, 256, torch.float32, torch.float32, wanted)
    # 90% of 80 GiB, minus 10 GiB of weights and 2 GiB of graph pool, minus the step's 3 GiB
    assert choice.value == int(0.9 * 80 * GiB) - 12 * GiB - 3 * GiB
    assert "3.00 GiB for the largest step" in choice.reason
    assert shapes[0][0] == 300  # the eager profile pads every running sequence, past the largest graph bucket
    first_capture = dev.events.index("capture")
    assert dev.events.index("forward") < first_capture < len(dev.events) - 1 - dev.events[::-1].index("memory")
    assert fake_cuda.captures[0]["locked"] and fake_cuda.captures[0]["mode"] == "thread_local"


def test_no_profile_where_the_allocator_keeps_no_peak(chat_tokenizer):
    dev = SimulatedGpu(FakeGraphs())
    dev.allocator_tracks_peaks = False
    model = tiny_model(300, seed=3)
    calls = []
    model.lm_head.register_forward_hook(lambda *_a: calls.append(1) and None)
    choice = profiled_kv_budget(dev, model, EngineConfig(block_size=16), 256, torch.float32, torch.float32, 100 * GiB)
    assert calls == [] and choice.value == int(0.9 * 80 * GiB) - 10 * GiB


def test_decode_graphs_without_a_capturer_capture_nothing():
    graphs = DecodeGraphs(lambda inp: None, 4, 0, 8, 32, 10, torch.device("cpu"), capturer=None)
    assert graphs.graphs == {} and not graphs.replays
