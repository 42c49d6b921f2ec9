"""The engine's public data types: what a caller asks for and what it gets back.

Shared by the engine, the server, `chat`, `generate`, RL and evaluations. Plain dataclasses, so the
server and the tests can build them cheaply. Imports go one way: `errors` and `structured/spec` below
this module, `sampling_params` (the one mapping from a caller's fields, and their check) above it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from portachat.engine.errors import EngineError
from portachat.engine.structured.spec import StructuredSpec

__all__ = ["EngineError", "FinishReason", "RequestOutput", "SamplingParams"]  # EngineError's home: errors.py


@dataclass
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    seed: int | None = None  # same seed + same prompt -> same tokens
    stop: list[str] = field(default_factory=list)  # stop strings (not included in the output)
    stop_token_ids: list[int] = field(default_factory=list)  # in addition to the model's end-of-turn ids
    ignore_eos: bool = False
    repetition_penalty: float = 1.0  # > 1 discourages tokens already in prompt or output (HF/vLLM meaning)
    presence_penalty: float = 0.0  # OpenAI meaning: subtracted once from logits of tokens already generated
    frequency_penalty: float = 0.0  # OpenAI meaning: subtracted per occurrence in the generated text
    logprobs: bool = False  # report the log-probability of each chosen token
    top_logprobs: int = 0  # with logprobs: also the k likeliest tokens of each step (id, logprob)
    logit_bias: dict[int, float] = field(default_factory=dict)  # added to the raw logits (OpenAI's -100..100)
    use_tools: bool = True  # run the calculator when the model emits a tool call (our chat format)
    adapter: str | None = None  # a LoRA adapter loaded in the engine (LLMEngine.add_adapter); None = base
    structured: StructuredSpec | None = None  # constrain the output to a schema/regex/choice/grammar
    priority: int = 0  # vLLM's: waiting requests are admitted lowest first (the server's batch lines run at 1)


FinishReason = Literal["stop", "length", "abort", "error"]


@dataclass
class RequestOutput:
    """One step's news for one request: the text and tokens added since the last output.

    `text` never ends inside a UTF-8 character (incremental detokenization holds bytes back), so
    concatenating every `text` of a request gives exactly the final text.
    """

    request_id: str
    text: str
    token_ids: list[int]
    logprobs: list[float] | None = None
    finished: bool = False
    finish_reason: FinishReason | None = None
    error: str | None = None  # set with finish_reason "error": what happened and what to do
    prompt_tokens: int = 0
    completion_tokens: int = 0
    stop_string: str | None = None  # with finish_reason "stop": the stop string that matched, if one did
    top_logprobs: list[list[tuple[int, float]]] | None = None  # per logprob: the k likeliest (id, logprob)
