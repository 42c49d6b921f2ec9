"""A draft's output head cut to the tokens it is likely to propose (FR-Spec's frequency-ranked drafting).

A small draft's cost at batch 1 is the bytes it reads a step, and for a draft cut from a model with
a large vocabulary most of them are the output head: SmolLM2's 49,152 x 576 head is 28M of the 42M
parameters of a 4-layer draft. Keeping only the N most frequent tokens shrinks the head N/V-fold;
proposals outside them are never made, which costs acceptance only where the target would have
picked a rare token. The target still scores every token, so greedy output stays the target's own
and sampled output keeps its distribution (the draft's q is zero outside the kept tokens, and
rejection sampling takes q as it is).

Frequency here is the id order of a byte-level BPE (merges are learnt most frequent first: low ids are
common pieces), plus the ids the caller must keep (the stop tokens, wherever the tokenizer puts them).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from portachat.i18n import _


def kept_token_ids(vocab_rows: int, size: int, keep: Iterable[int] = ()) -> torch.Tensor:
    """The first `size` ids plus `keep`, sorted: head row i proposes token ids[i]."""
    if size < 1:
        raise ValueError(f"the draft vocabulary must keep at least 1 token, got {size}")
    ids = set(range(min(size, vocab_rows))) | {int(i) for i in keep if 0 <= int(i) < vocab_rows}
    return torch.tensor(sorted(ids), dtype=torch.long)


def trim_output_head(model: nn.Module, size: int, keep: Iterable[int] = ()) -> torch.Tensor | None:
    """Replace `model.lm_head` by one over the kept tokens (in place); return the row -> token id map,
    or None when `size` keeps the whole vocabulary."""
    head = model.lm_head
    if size >= head.out_features:
        return None
    if type(head) is not nn.Linear:
        raise ValueError(_("a reduced draft vocabulary needs a plain output head; this draft's is a {kind} "
                           "(quantized drafts keep their whole vocabulary): drop --speculative-draft-vocab").format(
            kind=type(head).__name__))
    ids = kept_token_ids(head.out_features, size, keep)
    small = nn.Linear(head.in_features, len(ids), bias=head.bias is not None, device=head.weight.device,
                      dtype=head.weight.dtype)
    with torch.no_grad():
        # A copy of the kept rows: a head tied to the embedding stays whole for the embedding.
        small.weight.copy_(head.weight.detach()[ids.to(head.weight.device)])
        if head.bias is not None:
            small.bias.copy_(head.bias.detach()[ids.to(head.weight.device)])
    model.lm_head = small.requires_grad_(False)
    return ids
