"""Speculative decoding settings (vLLM's names: num_speculative_tokens, prompt_lookup_max/min)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

NGRAM_NAMES = ("ngram", "[ngram]")  # `--speculative-model ngram`; vLLM's old spelling was "[ngram]"


@dataclass
class SpeculativeConfig:
    method: Literal["ngram", "draft_model"]
    num_speculative_tokens: int = 4  # K: tokens proposed per sequence and step
    prompt_lookup_max: int = 4  # ngram: longest suffix looked up earlier in the sequence
    prompt_lookup_min: int = 2  # ngram: shortest one worth a K-token guess
    short_match_tokens: int = 1  # ngram: tokens guessed from a shorter match (down to 1 token); 0: none
    max_batch: int = 4  # steps decoding more sequences than this run without speculation
    draft: Any = None  # draft_model: the draft GPT (loaded by the caller, vocabulary checked)
    draft_vocab_size: int | None = None  # draft_model: its head keeps the N most frequent tokens (None: all)
    keep_token_ids: tuple[int, ...] = ()  # ... and these (the target's stop tokens)

    def __post_init__(self) -> None:
        if self.method not in ("ngram", "draft_model"):
            raise ValueError(f"speculative method must be 'ngram' or 'draft_model', got {self.method!r}")
        if self.num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be at least 1, got {self.num_speculative_tokens}")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError(
                "need 1 <= ngram_prompt_lookup_min <= ngram_prompt_lookup_max, got "
                f"{self.prompt_lookup_min} and {self.prompt_lookup_max}"
            )
        if self.short_match_tokens < 0:
            raise ValueError(f"short_match_tokens must be at least 0, got {self.short_match_tokens}")
        if self.max_batch < 1:
            raise ValueError(f"speculative max batch must be at least 1, got {self.max_batch}")
        if self.draft_vocab_size is not None and self.draft_vocab_size < 1:
            raise ValueError(f"the draft vocabulary must keep at least 1 token, got {self.draft_vocab_size}")
        if self.method == "draft_model" and self.draft is None:
            raise ValueError("the draft_model method needs a draft model")
