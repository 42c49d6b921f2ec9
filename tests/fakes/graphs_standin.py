"""A stand-in for a vendor's graph API (torch.cuda's CUDAGraph / torch_npu's NPUGraph shape: a graph class,
a `graph` capture context, `graph_pool_handle`, streams), on CPU tensors. Capture records every ATen op run
inside the context (a dispatch mode); replay runs them again on the same tensors and writes each result
into the tensor the capture produced: a graph's documented semantics (fixed addresses, inputs filled in
place, the output overwritten). `stale()` is the wrong variant: its replay does nothing."""

from __future__ import annotations

import contextlib
import types

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class RecordingGraph:
    def __init__(self) -> None:
        self.ops: list = []

    def replay(self) -> None:
        for func, args, kwargs, out in self.ops:
            fresh = func(*args, **kwargs)
            for old, new in zip(tree_leaves(out), tree_leaves(fresh), strict=True):
                if isinstance(old, torch.Tensor) and old is not new:
                    old.copy_(new)


class StaleGraph(RecordingGraph):
    def replay(self) -> None:  # launches nothing: outputs keep the values of the capture
        pass


class _Recorder(TorchDispatchMode):
    def __init__(self, graph: RecordingGraph) -> None:
        super().__init__()
        self.graph = graph

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.graph.ops.append((func, args, kwargs, out))
        return out


def module(graph_class: type = RecordingGraph) -> types.ModuleType:
    mod = types.ModuleType("graphs_standin")
    mod.CUDAGraph = mod.NPUGraph = mod.XPUGraph = graph_class
    mod.graph_pool_handle = lambda: ("pool",)
    mod.Stream = lambda: mod
    mod.wait_stream = lambda _other: None
    mod.current_stream = lambda: mod
    mod.stream = lambda _s: contextlib.nullcontext()
    mod.synchronize = lambda: None

    @contextlib.contextmanager
    def graph(g, pool=None, stream=None, capture_error_mode="global"):
        with _Recorder(g):
            yield

    mod.graph = graph
    return mod


def stale() -> types.ModuleType:
    return module(StaleGraph)
