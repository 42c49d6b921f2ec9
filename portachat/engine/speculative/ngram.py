"""Prompt-lookup drafting: the tokens that followed the latest earlier occurrence of the suffix.

Edits, summaries, code changes and quoting repeat long spans of the prompt; when the last n tokens
(n from prompt_lookup_max down to prompt_lookup_min) appeared before, whatever came after them
then is a good guess for what comes next. No model, one vectorised search per step.

A shorter match (down to one token) is a weaker guess: it drafts `short_tokens` tokens only. On the
CPU kernels verifying two rows costs what decoding one does, so a one-token guess is nearly free
(SmolLM2 editing code, bf16, 2 threads: 1.08x -> 1.23x over plain decoding, measured).
"""

from __future__ import annotations

import torch


def propose_ngram(tokens: list[int], k: int, n_min: int, n_max: int, short_tokens: int = 0) -> list[int]:
    """Up to `k` tokens continuing `tokens` where a suffix of n_min..n_max tokens recurs; else up to
    `short_tokens` (<= k) where a shorter one does; else []."""
    length = len(tokens)
    lowest = 1 if short_tokens > 0 else n_min
    if k < 1 or length < lowest + 1:
        return []
    seq = torch.tensor(tokens, dtype=torch.long)
    for n in range(min(n_max, length - 1), lowest - 1, -1):
        suffix = seq[length - n :]
        # Windows starting 0..length-n-1: every occurrence but the suffix itself, each with a successor.
        windows = seq[: length - 1].unfold(0, n, 1)
        hits = (windows == suffix).all(dim=1).nonzero()
        if hits.numel():
            start = int(hits[-1]) + n  # the latest occurrence: the most local context
            return tokens[start : start + (k if n >= n_min else min(k, short_tokens))]
    return []
