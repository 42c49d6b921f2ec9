"""Byte-level BPE tokenizer, chat rendering with loss masks, and tokenizer evaluation."""

from __future__ import annotations

from portachat.tokenizer.bpe import (
    BOS,
    EOS,
    MIN_VOCAB_SIZE,
    SPECIAL_TOKENS,
    SPLIT_PATTERN,
    Tokenizer,
    train_tokenizer,
)
from portachat.tokenizer.chat import normalize_messages, render_conversation, render_for_completion
from portachat.tokenizer.errors import (
    ChatFormatError,
    TokenizerConfigError,
    TokenizerError,
    TokenizerFormatError,
    TokenizerNotFoundError,
)
from portachat.tokenizer.evaluate import evaluate_tokenizer, format_evaluation
from portachat.tokenizer.template import CHAT_TEMPLATE

__all__ = [
    "BOS",
    "CHAT_TEMPLATE",
    "EOS",
    "MIN_VOCAB_SIZE",
    "SPECIAL_TOKENS",
    "SPLIT_PATTERN",
    "ChatFormatError",
    "Tokenizer",
    "TokenizerConfigError",
    "TokenizerError",
    "TokenizerFormatError",
    "TokenizerNotFoundError",
    "evaluate_tokenizer",
    "format_evaluation",
    "normalize_messages",
    "render_conversation",
    "render_for_completion",
    "train_tokenizer",
]
