"""Exceptions raised by the tokenizer package, so callers can catch exactly what went wrong."""

from __future__ import annotations


class TokenizerError(Exception):
    """Base class for tokenizer problems."""


class TokenizerNotFoundError(TokenizerError, FileNotFoundError):
    """The tokenizer directory or its tokenizer.json does not exist."""


class TokenizerFormatError(TokenizerError, ValueError):
    """tokenizer.json exists but cannot be parsed or lacks portachat's special tokens."""


class TokenizerConfigError(TokenizerError, ValueError):
    """Bad training settings (vocab size too small, non-positive caps, no text)."""


class ChatFormatError(TokenizerError, ValueError):
    """A conversation that does not follow the user/assistant message format."""
