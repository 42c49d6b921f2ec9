"""Texts or token ids -> one vector each: tokenize, batch by length, run the model's forward, pool,
shorten (Matryoshka models) and normalise. The server's /v1/embeddings and document search both
call an Embedder; it works over any forward that returns hidden states (BERT encoders, our GPT)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from portachat.engine.embeddings.config import PoolingConfig
from portachat.engine.embeddings.pooling import pool
from portachat.i18n import _

Hidden = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (ids [B, T], mask [B, T]) -> [B, T, C]


class EmbeddingInputError(ValueError):
    """An input the model cannot embed (empty, too long, unknown token id, bad dimensions)."""

    def __init__(self, message: str, index: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.index = index
        self.code = code


@dataclass(eq=False)
class Embedder:
    hidden: Hidden
    encode: Callable[[str], list[int]]  # text -> ids without special tokens
    pooling: PoolingConfig
    dimension: int  # the model's full vector size
    max_tokens: int  # per input, special tokens included
    vocab_size: int
    device: torch.device
    prefix: list[int] = field(default_factory=list)  # special tokens around every input ([CLS] ... [SEP])
    suffix: list[int] = field(default_factory=list)
    pad_id: int = 0
    description: str = ""
    max_batch_tokens: int = 8192  # padded tokens per forward: bounds activation memory
    module: torch.nn.Module | None = None  # the weights' owner (the registry counts their bytes)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    # ------------------------------------------------------------------ inputs

    def tokenize(self, text: str) -> list[int]:
        """Ids of `text` with the model's special tokens, as its sentence-transformers tokenizer gives them."""
        return self.with_special_tokens(self.encode(text.lower() if self.pooling.lowercase else text))

    def with_special_tokens(self, ids: list[int]) -> list[int]:
        return [*self.prefix, *ids, *self.suffix]

    def truncate(self, ids: list[int]) -> list[int]:
        """At most max_tokens ids, the special tokens kept (sentence-transformers truncates the same way)."""
        if len(ids) <= self.max_tokens:
            return ids
        keep = self.max_tokens - len(self.prefix) - len(self.suffix)
        return [*ids[: len(self.prefix) + keep], *self.suffix]

    def check_dimensions(self, dimensions: int | None) -> None:
        if dimensions is None or dimensions == self.dimension:
            return
        if dimensions < 1:
            raise EmbeddingInputError(_("dimensions must be at least 1 (got {dimensions}).").format(dimensions=dimensions))
        if dimensions > self.dimension:
            raise EmbeddingInputError(_("This model's embeddings have {size} dimensions; dimensions={dimensions} is "
                                        "larger.").format(size=self.dimension, dimensions=dimensions))
        allowed = self.pooling.matryoshka
        if allowed is None:
            raise EmbeddingInputError(_("This model only makes {size}-dimensional embeddings: it was not trained for "
                                        "shorter ones (Matryoshka), so dimensions={dimensions} is not supported. "
                                        "Leave dimensions out or send {size}.").format(
                size=self.dimension, dimensions=dimensions))
        if allowed and dimensions not in allowed:
            raise EmbeddingInputError(_("This model supports dimensions in {allowed} (and {size}); got "
                                        "{dimensions}.").format(
                allowed=list(allowed), size=self.dimension, dimensions=dimensions))

    def check_inputs(self, inputs: list[list[int]]) -> None:
        """EmbeddingInputError for an empty or over-long input or a token id outside the vocabulary."""
        for i, ids in enumerate(inputs):
            if not ids:
                raise EmbeddingInputError(_("Input {index} is empty: send some text or token ids.").format(index=i),
                                          index=i)
            if len(ids) > self.max_tokens:
                raise EmbeddingInputError(
                    _("This model's maximum input length is {limit} tokens, but input {index} has {tokens} tokens. "
                      "Shorten it or split it into chunks.").format(limit=self.max_tokens, index=i, tokens=len(ids)),
                    index=i, code="context_length_exceeded")
            bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
            if bad is not None:
                raise EmbeddingInputError(_("Token id {token} in input {index} is outside this model's vocabulary "
                                            "(0..{last}).").format(token=bad, index=i, last=self.vocab_size - 1),
                                          index=i)

    # ------------------------------------------------------------------ forward

    def _batches(self, order: list[int], lengths: list[int]) -> list[list[int]]:
        """Indices sorted by length, cut so that each padded batch stays within max_batch_tokens."""
        batches: list[list[int]] = []
        current: list[int] = []
        for i in order:
            if current and (len(current) + 1) * lengths[i] > self.max_batch_tokens:
                batches.append(current)
                current = []
            current.append(i)
        return [*batches, current] if current else batches

    def embed_ids(self, inputs: list[list[int]], dimensions: int | None = None) -> torch.Tensor:
        """One vector per input (ids with special tokens, e.g. from `tokenize`), fp32 on the CPU, in
        input order. Raises EmbeddingInputError for empty or over-long inputs and bad dimensions."""
        self.check_inputs(inputs)
        self.check_dimensions(dimensions)
        dim = dimensions or self.dimension
        out = torch.empty(len(inputs), dim, dtype=torch.float32)
        lengths = [len(ids) for ids in inputs]
        for batch in self._batches(sorted(range(len(inputs)), key=lengths.__getitem__), lengths):
            width = max(lengths[i] for i in batch)
            ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros(len(batch), width, dtype=torch.long)
            for row, i in enumerate(batch):
                ids[row, : lengths[i]] = torch.tensor(inputs[i])
                mask[row, : lengths[i]] = 1
            ids, mask = ids.to(self.device), mask.to(self.device)
            # One forward at a time: concurrent requests would only compete for the same device.
            with self._lock, torch.inference_mode():
                vectors = pool(self.hidden(ids, mask), mask, self.pooling.pooling)[:, :dim]
                if self.pooling.normalize:
                    vectors = F.normalize(vectors, p=2, dim=-1)
                out[batch] = vectors.float().cpu()
        return out

    def embed_texts(self, texts: list[str], dimensions: int | None = None) -> torch.Tensor:
        """[len(texts), dimensions or dimension] fp32 vectors (unit length when the model normalises).
        Texts longer than max_tokens are truncated, as sentence-transformers does; an empty text raises."""
        return self.embed_ids([self.truncate(self.tokenize(t)) for t in texts], dimensions)
