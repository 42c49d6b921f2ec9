"""The one engine builder: every LLMEngine the product runs (server, `chat`, `generate`, eval, RL
rollouts, training samples) is made by `build_engine`; `portachat.engine.loading` adds what a model
path needs first (resolve, load, shard, quantize) and `portachat.engine.oneshot` what an engine over
a borrowed model needs."""

from __future__ import annotations

from portachat.device import Device
from portachat.engine.config import EngineConfig
from portachat.engine.engine import LLMEngine
from portachat.engine.runner import ModelRunner
from portachat.engine.workers.tp_runner import TensorParallelRunner
from portachat.model.gpt import GPT
from portachat.tokenizer.protocol import ChatTokenizer


def build_engine(model: GPT, tokenizer: ChatTokenizer, config: EngineConfig | None = None,
                 device: Device | None = None) -> LLMEngine:  # fmt: skip
    """An engine over `model`. A tensor-parallel shard (portachat.model.tensor_parallel) gets the
    runner that hands every step to the worker processes holding the other shards."""
    sharded = getattr(model, "tensor_parallel", None) is not None
    return LLMEngine(model, tokenizer, config, device=device,
                     runner_cls=TensorParallelRunner if sharded else ModelRunner)
