"""Device graphs: record the kernels of a step once, then launch them all again with one call.

A decode step of a small model is bound by the host launching a few hundred small kernels, not by
the device running them; replaying a captured graph removes that cost. CUDA graphs are the model
(torch.cuda.CUDAGraph); torch_npu's NPUGraph and torch.xpu's XPUGraph follow the same API (a graph
class, a `graph` capture context, `graph_pool_handle`), so one wrapper serves them. Whether a device
uses graphs at all is `inference.decode_graphs`'s decision.

A captured graph reads and writes fixed addresses: callers fill the inputs they captured in place
and read the output tensor the capture returned, which the next replay overwrites.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from portachat.device.probe import device_module

GRAPH_CLASSES = {"cuda": "CUDAGraph", "npu": "NPUGraph", "xpu": "XPUGraph"}


def graphs_available(device_type: str) -> bool:
    """Whether this torch exposes graph capture for `device_type`."""
    name = GRAPH_CLASSES.get(device_type)
    mod = device_module(device_type) if name else None
    return mod is not None and all(hasattr(mod, a) for a in (name, "graph", "graph_pool_handle"))


@dataclass
class CapturedGraph:
    graph: Any
    output: Any  # what the captured callable returned; overwritten in place by every replay

    def replay(self) -> Any:
        self.graph.replay()
        return self.output


class GraphCapturer:
    """Captures callables into graphs that share one memory pool: the graphs replay one at a time,
    so their intermediate buffers may overlap (only outputs that callers hold stay reserved)."""

    def __init__(self, device_type: str) -> None:
        if not graphs_available(device_type):
            raise RuntimeError(f"this torch has no graph capture for {device_type!r}")
        self.mod = device_module(device_type)
        self.graph_class = getattr(self.mod, GRAPH_CLASSES[device_type])
        self.pool = self.mod.graph_pool_handle()
        self.num_captured = 0

    def capture(self, fn: Callable[[], Any]) -> CapturedGraph:
        """Run `fn` once on a side stream (PyTorch's recipe: lazy initialisation and workspace
        allocations happen outside the capture), then capture it. Captured work does not run:
        `fn` must be safe to run twice (the warm-up, then the first replay)."""
        mod = self.mod
        side = mod.Stream()
        side.wait_stream(mod.current_stream())
        with mod.stream(side):
            fn()
        mod.current_stream().wait_stream(side)
        graph = self.graph_class()
        with mod.graph(graph, pool=self.pool):
            output = fn()
        self.num_captured += 1
        return CapturedGraph(graph, output)
