"""The engine's refusal: what every engine module (and the server mapping it to HTTP) raises and catches.

Its own module, below `types.py` and `structured/spec.py`, so that both can import it at the top
without importing each other."""

from __future__ import annotations

from typing import Literal


class EngineError(RuntimeError):
    """A request the engine refuses (bad parameters, prompt past the context, queue full)."""

    def __init__(
        self, message: str, kind: Literal["invalid", "too_long", "queue_full", "internal"] = "invalid"
    ):
        super().__init__(message)
        self.kind = kind
