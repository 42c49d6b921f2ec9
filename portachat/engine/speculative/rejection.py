"""Verification: keep the draft's longest prefix the target agrees with, then one token of the target's.

Greedy rows accept a draft token while it is the target's argmax at that position, so the output is
the target's own greedy output. Sampled rows use standard speculative sampling (Leviathan et al.,
Chen et al.): accept draft token x with probability min(1, p(x)/q(x)); at the first rejection draw
from norm(max(0, p - q)); when every draft is accepted draw a bonus token from p at the last row.
Each emitted token is then distributed exactly as the target's own sample. p is the target's
distribution after temperature, top-k and top-p (the sampler's rules); q is the drafter's, one-hot
for prompt lookup. Uniform numbers come from the request's own generator, so a seed still fixes
the output.
"""

from __future__ import annotations

import torch

from portachat.engine.sampler import filter_top_k_top_p
from portachat.engine.types import SamplingParams


def processed_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Rows [R, V] of raw logits -> the distributions the sampler draws from (temperature > 0)."""
    scaled = logits.float() / params.temperature
    if params.top_k > 0 or params.top_p < 1.0:
        scaled = torch.stack([filter_top_k_top_p(row, params.top_k, params.top_p) for row in scaled])
    return torch.softmax(scaled, dim=-1)


def draw_from(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from an unnormalised distribution [V] by inverse CDF (zero-mass tokens never).
    On the host in float64: one row is cheap to move, and not every device has float64 (MPS)."""
    probs = probs.detach().to("cpu", torch.float64)
    cdf = torch.cumsum(probs, dim=-1)
    target = float(torch.rand((), generator=generator)) * cdf[-1]
    chosen = int(torch.searchsorted(cdf, target.reshape(1), right=True))
    return chosen if chosen < probs.numel() else int(probs.argmax())


def verify_greedy(logits: torch.Tensor, draft: list[int]) -> list[int]:
    """logits [len(draft) + 1, V]: the accepted drafts, then the target's argmax after them."""
    target = logits.argmax(dim=-1).tolist()
    accepted = 0
    while accepted < len(draft) and draft[accepted] == target[accepted]:
        accepted += 1
    return draft[:accepted] + [target[accepted]]


def verify_sampled(
    logits: torch.Tensor,
    draft: list[int],
    draft_probs: torch.Tensor | None,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> list[int]:
    """Speculative sampling over logits [K + 1, V]; draft_probs [K, V] is q (None: one-hot drafts)."""
    p = processed_probs(logits, params)
    out: list[int] = []
    for j, x in enumerate(draft):
        px = float(p[j, x])
        qx = 1.0 if draft_probs is None else float(draft_probs[j, x])
        if float(torch.rand((), generator=generator)) * qx < px:  # u < p/q without dividing by q
            out.append(x)
            continue
        if draft_probs is None:
            residual = p[j].clone()
            residual[x] = 0.0
        else:
            residual = (p[j] - draft_probs[j].to(p.dtype)).clamp_(min=0.0)
        if float(residual.sum()) <= 0.0:  # p == q up to rounding: the rejection had no mass to move
            residual = p[j]
        out.append(draw_from(residual, generator))
        return out
    out.append(draw_from(p[len(draft)], generator))
    return out
