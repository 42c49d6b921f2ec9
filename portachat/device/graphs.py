"""Device graphs: record the kernels of a step once, then launch them all again with one call.

A decode step of a small model is bound by the host launching a few hundred small kernels, not by
the device running them; replaying a captured graph removes that cost. CUDA graphs are the model
(torch.cuda.CUDAGraph); torch_npu's NPUGraph and torch.xpu's XPUGraph follow the same API (a graph
class, a `graph` capture context, `graph_pool_handle`), so one wrapper serves them. Whether a device
uses graphs at all is `inference.decode_graphs`'s decision.

A captured graph reads and writes fixed addresses: callers fill the inputs they captured in place
and read the output tensor the capture returned, which the next replay overwrites.

Engines served together (data-parallel replicas, several models) are threads of one process. A capture
in the default "global" mode makes every other thread's sync or allocation an error (and theirs can
invalidate it), so captures here take one process-wide lock, one at a time, and use the
"thread_local" mode: only the capturing thread's own unsafe calls are errors.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from portachat.device.probe import device_module

GRAPH_CLASSES = {"cuda": "CUDAGraph", "npu": "NPUGraph", "xpu": "XPUGraph"}
CAPTURE_MODE = "thread_local"  # other threads (engines of the same server) keep working during a capture
CAPTURE_LOCK = threading.RLock()  # process-wide: one capture at a time, whichever engine runs it


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
        with CAPTURE_LOCK:
            side = mod.Stream()
            side.wait_stream(mod.current_stream())
            with mod.stream(side):
                fn()
            mod.current_stream().wait_stream(side)
            graph = self.graph_class()
            with mod.graph(graph, pool=self.pool, **capture_mode_kwargs(mod.graph)):
                output = fn()
            self.num_captured += 1
        return CapturedGraph(graph, output)


def capture_mode_kwargs(graph_context: Callable) -> dict[str, str]:
    """The thread-local capture mode where the vendor's `graph` context takes one (torch.cuda.graph
    does since torch 1.13; a port without the argument captures in its own default mode)."""
    try:
        params = inspect.signature(graph_context).parameters
    except (TypeError, ValueError):  # a builtin without a signature: pass nothing it may reject
        return {}
    takes = "capture_error_mode" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
    return {"capture_error_mode": CAPTURE_MODE} if takes else {}
