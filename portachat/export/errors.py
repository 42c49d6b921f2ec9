"""Export errors: what cannot be exported, and what to do about it."""

from __future__ import annotations


class ExportError(RuntimeError):
    """A checkpoint that cannot be exported as asked; the message says why and what to do."""
