"""The verifier keeps the target's distribution: greedy takes the target's argmax after the agreed
prefix; sampled emissions follow p whatever q proposed (counted over many draws)."""

from __future__ import annotations

import torch

from portachat.engine.speculative.rejection import processed_probs, verify_greedy, verify_sampled
from portachat.engine.types import SamplingParams


def test_greedy_keeps_the_agreed_prefix_then_the_target_token():
    logits = torch.full((4, 6), -1.0)
    for row, best in enumerate([2, 5, 1, 0]):
        logits[row, best] = 1.0
    assert verify_greedy(logits, [2, 5, 1]) == [2, 5, 1, 0]  # all accepted, plus the bonus token
    assert verify_greedy(logits, [2, 4, 1]) == [2, 5]  # first disagreement: the target's token
    assert verify_greedy(logits, [3, 5, 1]) == [2]


def _first_token_counts(p_logits, draft_probs, params, trials: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(p_logits.size(1))
    for _ in range(trials):
        if draft_probs is None:
            draft = [1]  # prompt lookup: a fixed guess, q one-hot
        else:
            draft = [int(torch.multinomial(draft_probs[0], 1, generator=g))]
        counts[verify_sampled(p_logits, draft, draft_probs, params, g)[0]] += 1
    return counts


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0  # nothing outside the target's support
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def test_sampled_emissions_follow_the_target_distribution():
    torch.manual_seed(3)
    V, trials = 6, 6000
    p_logits = torch.randn(2, V) * 1.5
    q = torch.softmax(torch.randn(1, V) * 1.5, dim=-1)
    params = SamplingParams(temperature=0.8, top_k=4)
    p = processed_probs(p_logits, params)[0]
    # 99.99% quantile of chi-square with 3 degrees of freedom (4 tokens survive top-k) is ~21.1.
    assert _chi_square(_first_token_counts(p_logits, q, params, trials), p) < 21.1
    assert _chi_square(_first_token_counts(p_logits, None, params, trials), p) < 21.1
    # A drafter that is far off still gives p; a wrong verifier (always accept) would give q.
    far = torch.zeros(1, V)
    far[0, int(p.argmin())] = 1.0
    assert _chi_square(_first_token_counts(p_logits, far, params, trials), p) < 21.1
