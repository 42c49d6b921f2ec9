"""An engine over a model someone else owns, for one batch of generations (samples, evals, checks).

Training samples, RL rollouts, training evals, `model_complete`, decode profiling and parity tests
generate from a model that is not the engine's to change. The engine built here (by
portachat.engine.build, as every engine is) therefore keeps the weights in their dtype and on
their device, gives the model back in the train/eval mode it had, holds a KV cache sized for
exactly the batch, and runs with prefix caching off (cached keys/values would outlive an in-place
weight update) and uncompiled (one batch never pays a compilation back).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from torch import nn

from portachat.device import Device, get_device
from portachat.device.device import device_holding
from portachat.engine.build import build_engine
from portachat.engine.config import EngineConfig
from portachat.engine.engine import LLMEngine
from portachat.engine.offline import Completion
from portachat.engine.types import EngineError, SamplingParams
from portachat.i18n import _
from portachat.model.gpt import GPT
from portachat.quant import model_device
from portachat.tokenizer.protocol import ChatTokenizer, ToolTokens

BLOCK_SIZE = 16
MAX_NUM_SEQS = 32  # sequences decoded together; a larger batch queues (EngineConfig's default)


class TokenIdsOnly:
    """The ChatTokenizer protocol for a model with no tokenizer at hand (parity tests, profiling,
    benchmarks): token ids in and out, no stop token, no tool, no text."""

    def __init__(self, vocab_size: int) -> None:
        self._vocab_size = vocab_size

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def bos_id(self) -> int | None:
        return None

    @property
    def stop_ids(self) -> set[int]:
        return set()

    @property
    def tool_tokens(self) -> ToolTokens | None:
        return None

    @property
    def chat_template(self) -> str | None:
        return None  # no tokenizer, no template

    def encode(self, text: str) -> list[int]:
        raise EngineError(_("this engine has no tokenizer: give prompts as token ids"), kind="invalid")

    def decode(self, ids: list[int]) -> str:
        return ""

    def token_bytes(self, token_id: int) -> bytes:
        return b""

    def render_prompt(self, messages: list[dict[str, Any]]) -> list[int]:
        raise EngineError(_("this engine has no tokenizer: it cannot render a conversation"), kind="invalid")


def device_of(model: nn.Module) -> Device:
    """The Device holding the model's weights: the engine moves a model to its device, and a model
    it does not own must stay where it is."""
    where = model_device(model)
    dev = device_holding(where)
    if dev is None:
        raise EngineError(_("the model is on {where} but this process's device is {device}; pass its Device").format(
            where=where, device=get_device().torch_device), kind="invalid")
    return dev


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Eval mode while generating (LoRA dropout off), then the mode the model had."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def engine_for(
    model: GPT,
    tokenizer: ChatTokenizer | None = None,
    device: Device | None = None,
    *,
    max_num_seqs: int = 1,
    max_model_len: int | None = None,
    max_num_batched_tokens: int | None = None,
    prefix_caching: bool = False,
) -> LLMEngine:
    """An LLMEngine over `model` as it is, with room for `max_num_seqs` sequences of `max_model_len`
    tokens (default: the model's context; longer is allowed: rotary grows). No tokenizer: ids only.
    `prefix_caching`: for a caller that calls `reload_weights` after every weight update (GRPO: the G
    replies of a prompt share its blocks)."""
    length = max_model_len or model.config.max_seq_len
    config = EngineConfig(
        max_model_len=length,
        max_num_seqs=max_num_seqs,
        block_size=BLOCK_SIZE,
        num_blocks=max_num_seqs * -(-length // BLOCK_SIZE) + 1,
        enable_prefix_caching=prefix_caching,
        dtype="model",
        compile=False,
    )
    if max_num_batched_tokens is not None:
        config.max_num_batched_tokens = max_num_batched_tokens
    with eval_mode(model):  # the engine leaves the model in eval mode; give it back as it was
        return build_engine(model, tokenizer or TokenIdsOnly(model.config.vocab_size), config,
                            device or device_of(model))


def generate_once(
    model: GPT,
    prompts: Sequence[list[int]],
    params: SamplingParams | Sequence[SamplingParams],
    tokenizer: ChatTokenizer | None = None,
    device: Device | None = None,
) -> list[Completion]:
    """Every prompt run to completion, in order, through an engine built for exactly this batch.

    Each reply gets its full `max_tokens`, even past the model's context. Raises when the engine
    fails a request (a failed sample is a bug to see, not an empty reply)."""
    plist = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
    if len(plist) != len(prompts):
        raise EngineError(_("{prompts} prompts but {params} sampling params").format(
            prompts=len(prompts), params=len(plist)), kind="invalid")
    if not prompts:
        return []
    longest = max(len(p) + q.max_tokens for p, q in zip(prompts, plist, strict=True))
    engine = engine_for(model, tokenizer, device, max_num_seqs=min(len(prompts), MAX_NUM_SEQS),
                        max_model_len=longest)
    with eval_mode(model):
        done = engine.generate([list(p) for p in prompts], plist)
    for completion in done:
        if completion.error:
            raise EngineError(_("generation failed: {error}").format(error=completion.error), kind="internal")
    return done
