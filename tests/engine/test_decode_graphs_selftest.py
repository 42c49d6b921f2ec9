"""Decode graphs on NPU / ROCm / DCU check themselves at the first engine start: through a stand-in graph API
that replays what it captured (tests/fakes/graphs_standin.py) the engine replays its decode steps and
generates what the eager engine does; a stand-in whose replay launches nothing fails the self-test and the
engine stays eager (and still generates the same)."""

from __future__ import annotations

import types

import pytest
import torch
from engine_testing import make_engine, tiny_model

from portachat.device import graphs as graphs_mod
from portachat.device.graphs import GraphCapturer
from portachat.engine import SamplingParams
from portachat.engine.decode_graphs import check_graph_replay
from portachat.ops import fast_path
from tests.fakes import forget_fast_path_answers, graphs_standin


def _cpu_backed(kind: str) -> types.SimpleNamespace:
    return types.SimpleNamespace(type="npu" if kind == "npu" else "cuda", kind=kind, name=f"{kind} stand-in",
                                 torch_device=torch.device("cpu"), dtype=torch.float32, synchronize=lambda: None)  # fmt: skip


@pytest.fixture(autouse=True)
def _fresh():
    forget_fast_path_answers()
    yield
    forget_fast_path_answers()


@pytest.mark.parametrize("kind", ["npu", "dcu", "rocm"])
def test_a_replaying_graph_api_passes_and_a_stale_one_fails(monkeypatch, kind):
    dev = _cpu_backed(kind)
    monkeypatch.setattr(graphs_mod, "device_module", lambda t: graphs_standin.module())
    assert check_graph_replay(dev).ok
    monkeypatch.setattr(graphs_mod, "device_module", lambda t: graphs_standin.stale())
    stale = check_graph_replay(dev)
    assert not stale.ok and "disagrees" in stale.reason


def _generate(engine) -> list[list[int]]:
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13]]
    outs = engine.generate(prompts, SamplingParams(max_tokens=6, temperature=0.0))
    return [o.token_ids for o in outs]


@pytest.mark.parametrize("replaying", [True, False])
def test_the_engine_replays_only_graphs_that_passed(monkeypatch, chat_tokenizer, replaying):
    model = tiny_model(chat_tokenizer.vocab_size, seed=4)
    want = _generate(make_engine(chat_tokenizer, model=model, max_num_seqs=4, max_model_len=64))
    api = graphs_standin.module() if replaying else graphs_standin.stale()
    monkeypatch.setattr(graphs_mod, "device_module", lambda t: api if t == "npu" else None)
    dev = _cpu_backed("npu")
    monkeypatch.setattr(fast_path, "device_holding", lambda where: dev)
    monkeypatch.setattr(fast_path, "device_candidates", lambda d: ("decode_graphs",))
    engine = make_engine(chat_tokenizer, model=model, max_num_seqs=4, max_model_len=64)
    engine.runner.enable_decode_graphs(4, GraphCapturer("npu"))
    graphs = engine.runner.graphs
    assert graphs.replays is replaying and bool(graphs.graphs) is replaying
    assert _generate(engine) == want
