"""One request inside the engine: its tokens, KV blocks, sampling state and stream state."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import torch

from portachat.engine.detokenizer import Detokenizer
from portachat.engine.types import FinishReason, SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Sequence:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    detokenizer: Detokenizer
    generator: torch.Generator | None  # per-request RNG: same seed, same tokens, whatever the batch
    arrival: int  # order of arrival (FIFO admission, newest preempted first)
    token_ids: list[int] = field(default_factory=list)  # prompt + output (sampled and forced)
    num_computed: int = 0  # tokens whose K/V are in the cache
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # hashes of the leading full blocks
    status: Status = Status.WAITING
    finish_reason: FinishReason | None = None
    error: str | None = None
    # Output bookkeeping since the last RequestOutput.
    new_token_ids: list[int] = field(default_factory=list)
    new_logprobs: list[float] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    new_top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    # Calculator tool state: tokens of the expression being written, forced tokens waiting to go in.
    in_tool_call: bool = False
    tool_expression: list[int] = field(default_factory=list)
    num_preemptions: int = 0
    # Seeds the prefix-cache hashes: K/V computed under one LoRA adapter never serve another.
    cache_salt: int | None = None
    # Structured output: the grammar matcher (llguidance.LLMatcher), advanced on every accepted token.
    matcher: Any = None

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_ids)

    @property
    def num_prompt(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - len(self.prompt_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_ids) :]

    @property
    def num_uncomputed(self) -> int:
        return len(self.token_ids) - self.num_computed

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED
