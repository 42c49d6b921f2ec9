"""The inference engine: paged KV cache, continuous batching, chunked prefill, sampling, tools.

Layout after nano-vllm: `block_manager` (KV blocks, prefix reuse), `scheduler` (which tokens run
each step), `runner` (one forward over a flat batch), `sampler`, `detokenizer`, `calculator`,
`engine` (the loop the server, `chat`, `generate`, RL and evals drive), `speculative/` (drafts
checked by the target in one forward), `build` (the one place an engine is made), `loading` (a
model path -> ServedModel) and `oneshot` (an engine around a model the caller keeps: training
samples, RL rollouts, in-memory evals, profiling).
"""

from portachat.engine.config import EngineConfig
from portachat.engine.engine import LLMEngine
from portachat.engine.offline import Completion
from portachat.engine.types import EngineError, RequestOutput, SamplingParams

__all__ = ["Completion", "EngineConfig", "EngineError", "LLMEngine", "RequestOutput", "SamplingParams"]
