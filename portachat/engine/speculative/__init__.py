"""Speculative decoding: cheap guesses of the next tokens, checked by the target in one forward.

A drafter proposes up to K tokens per sequence (`ngram`: copied from earlier in the prompt or the
reply; `draft_model`: a small model sharing the target's vocabulary). The target scores the last
real token and the K drafts as one multi-token chunk of the runner's packed forward (K/V written to
the paged cache like a prefill), and `rejection` keeps the longest prefix the target agrees with
plus one token of its own: greedy output is the target's own greedy output, sampled output is
distributed as the target's. `Speculator` is the part the engine talks to.
"""

from portachat.engine.speculative.config import SpeculativeConfig
from portachat.engine.speculative.policy import speculation_allowed
from portachat.engine.speculative.speculator import Speculator

__all__ = ["SpeculativeConfig", "Speculator", "speculation_allowed"]
