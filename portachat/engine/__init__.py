"""The inference engine: paged KV cache, continuous batching, chunked prefill, sampling, tools.

Layout after nano-vllm: `block_manager` (KV blocks, prefix reuse), `scheduler` (which tokens run
each step), `runner` (one forward over a flat batch), `sampler`, `detokenizer`, `calculator`,
`engine` (the loop the server, `chat`, `generate`, RL and evals drive), `speculative/` (drafts
checked by the target in one forward), `build` (the one place an engine is made), `loading` (a
model path -> ServedModel) and `oneshot` (an engine around a model the caller keeps: training
samples, RL rollouts, in-memory evals, profiling).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from portachat.engine.config import EngineConfig
    from portachat.engine.engine import LLMEngine
    from portachat.engine.offline import Completion
    from portachat.engine.types import EngineError, RequestOutput, SamplingParams

# Loaded on first use (PEP 562), so importing a light module of the package (types, sampling_params)
# does not load torch: the command line builds its flags from them.
_HOMES = {
    "EngineConfig": "portachat.engine.config",
    "LLMEngine": "portachat.engine.engine",
    "Completion": "portachat.engine.offline",
    "EngineError": "portachat.engine.types",
    "RequestOutput": "portachat.engine.types",
    "SamplingParams": "portachat.engine.types",
}
__all__ = ["Completion", "EngineConfig", "EngineError", "LLMEngine", "RequestOutput", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
