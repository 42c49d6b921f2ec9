"""Structured output: a per-sequence token mask from a grammar library (llguidance), applied in the
sampler. JSON schemas, `json_object`, regexes, choices, grammars and enforced tool calls all reduce
to it.

`spec` (what a request asks for), `tokenizer` (the library's tokenizer from our protocol),
`compile` (spec -> matcher, cached; batched mask fills), `masks` (bits -> -inf on the logits).
The grammar library is imported only when a constrained request arrives; the package itself loads
no numpy (the command line's flags import the spec).
"""

from __future__ import annotations

from typing import Any

from portachat.engine.structured.spec import StructuredError, StructuredSpec


def is_constrained(seq: Any) -> bool:
    """Whether a sequence's tokens are masked by a grammar (speculative decoding skips those rows)."""
    return getattr(seq, "matcher", None) is not None


__all__ = ["StructuredError", "StructuredSpec", "is_constrained"]
