"""Which sequences may speculate: one predicate, for the features that change how a token is chosen."""

from __future__ import annotations

from portachat.engine.sampler import needs_penalties
from portachat.engine.sequence import Sequence
from portachat.engine.structured import is_constrained


def speculation_allowed(seq: Sequence) -> bool:
    """False for sequences whose next-token rule the verifier does not reproduce: penalties depend on
    the tokens before each position, and reported logprobs would need every verified row. Extend
    here for other per-token rules. Structured output: the grammar's mask changes which tokens may
    follow each draft token, and the verifier does not walk the grammar."""
    return not seq.params.logprobs and not needs_penalties(seq) and not is_constrained(seq) \
        and getattr(seq.params, "structured", None) is None
