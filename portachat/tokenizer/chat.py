"""Conversation rendering (nanochat's format) into token ids plus a loss mask.

A conversation is a list of messages `{"role": "system"|"user"|"assistant", "content": ...}`
(or a dict with a "messages" key holding that list). Content is a string; an assistant's content
may also be a list of parts `{"type": "text"|"python"|"python_output", "text": str}`, where a
python part is a tool call and a python_output part is what the tool returned. A leading system
message is merged into the first user message, as nanochat does.

    <|bos|><|user_start|>...<|user_end|><|assistant_start|>...<|assistant_end|>...

The mask is 1 where the model is trained to predict the token: assistant text, its python calls
(with their delimiters) and the closing <|assistant_end|>. User text, the tokens that open a turn,
and tool output (the tool wrote it, not the model) get 0.

Message content is always plain text: "<|assistant_end|>" typed by a user encodes as ordinary
tokens (Tokenizer.encode never parses control tokens), so no user can end a turn or forge a tool
output. Control tokens enter only from the structure of the conversation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from portachat.i18n import _
from portachat.tokenizer.bpe import (
    ASSISTANT_END,
    ASSISTANT_START,
    OUTPUT_END,
    OUTPUT_START,
    PYTHON_END,
    PYTHON_START,
    USER_END,
    USER_START,
)
from portachat.tokenizer.errors import ChatFormatError

if TYPE_CHECKING:
    from portachat.tokenizer.bpe import Tokenizer

PART_TYPES = ("text", "python", "python_output")
SYSTEM_SEPARATOR = "\n\n"  # between a merged system prompt and the first user message


def _text_of_parts(content: Any, where: str, allowed: tuple[str, ...]) -> list[tuple[str, str]]:
    if isinstance(content, str):
        return [("text", content)]
    if not isinstance(content, Sequence) or isinstance(content, (bytes, bytearray)):
        raise ChatFormatError(
            _("{where}: content must be a string or a list of parts, got {type}").format(
                where=where, type=type(content).__name__)
        )
    parts = []
    for j, part in enumerate(content):
        if not isinstance(part, Mapping) or not isinstance(part.get("text"), str):
            raise ChatFormatError(_("{where}, part {index}: expected {{'type': ..., 'text': str}}, got {part}").format(
                where=where, index=j, part=repr(part)))
        kind = part.get("type", "text")
        if kind not in allowed:
            raise ChatFormatError(_("{where}, part {index}: type {kind} not allowed here (allowed: {allowed})").format(
                where=where, index=j, kind=repr(kind), allowed=allowed))
        parts.append((kind, part["text"]))
    return parts


def normalize_messages(messages: Any) -> list[tuple[str, list[tuple[str, str]]]]:
    """Validate a conversation and return [(role, [(part_type, text), ...])] with the system
    message merged into the first user turn. Raises ChatFormatError on anything malformed."""
    if isinstance(messages, Mapping) and "messages" in messages:
        messages = messages["messages"]
    if not isinstance(messages, Sequence) or isinstance(messages, str) or len(messages) == 0:
        raise ChatFormatError(_("a conversation must be a non-empty list of {'role', 'content'} messages"))
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            raise ChatFormatError(_("message {index}: expected a dict with 'role' and 'content', got {message}").format(
                index=i, message=repr(m)))

    system = ""
    body = list(messages)
    if body[0]["role"] == "system":
        where = _("message {index} ({role})").format(index=0, role="system")
        system = "".join(t for _, t in _text_of_parts(body[0]["content"], where, ("text",)))
        body = body[1:]
        if not body or body[0]["role"] != "user":
            raise ChatFormatError(_("a system message must be followed by a user message"))

    offset = len(messages) - len(body)
    out = []
    for i, m in enumerate(body):
        expected = "user" if i % 2 == 0 else "assistant"
        where = _("message {index} ({role})").format(index=i + offset, role=m["role"])
        if m["role"] != expected:
            raise ChatFormatError(
                _("{where}: expected role {role}; after an optional leading system message, "
                  "roles must alternate user, assistant, user, ...").format(where=where, role=repr(expected))
            )
        if expected == "user":
            text = "".join(t for _, t in _text_of_parts(m["content"], where, ("text",)))
            if i == 0 and system:
                text = system + SYSTEM_SEPARATOR + text
            out.append(("user", [("text", text)]))
        else:
            out.append(("assistant", _text_of_parts(m["content"], where, PART_TYPES)))
    return out


def _merge_text_parts(parts: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Adjacent text parts become one, encoded as one string: the chat template joins them the same way,
    so transformers' ids match ours whatever the seams."""
    merged: list[tuple[str, str]] = []
    for kind, text in parts:
        if kind == "text" and merged and merged[-1][0] == "text":
            merged[-1] = ("text", merged[-1][1] + text)
        else:
            merged.append((kind, text))
    return merged


def render_conversation(
    tokenizer: Tokenizer, messages: Any, max_tokens: int | None = None
) -> tuple[list[int], list[int]]:
    """Token ids and loss mask (1 = train on it) for a conversation, cut to `max_tokens` if given."""
    if max_tokens is not None and max_tokens <= 0:
        raise ChatFormatError(_("max_tokens must be positive or None, got {value}").format(value=max_tokens))
    special = tokenizer.special_ids
    ids: list[int] = []
    mask: list[int] = []

    def add(token_ids: list[int], train: int) -> None:
        ids.extend(token_ids)
        mask.extend([train] * len(token_ids))

    add([tokenizer.bos_id], 0)
    for role, parts in normalize_messages(messages):
        if role == "user":
            add([special[USER_START]], 0)
            add(tokenizer.encode(parts[0][1]), 0)
            add([special[USER_END]], 0)
            continue
        add([special[ASSISTANT_START]], 0)
        for kind, text in _merge_text_parts(parts):
            if kind == "text":
                add(tokenizer.encode(text), 1)
            elif kind == "python":
                add([special[PYTHON_START], *tokenizer.encode(text), special[PYTHON_END]], 1)
            else:  # python_output: produced by the tool at inference time, so never a target
                add([special[OUTPUT_START], *tokenizer.encode(text), special[OUTPUT_END]], 0)
        add([special[ASSISTANT_END]], 1)

    if max_tokens is not None:
        ids, mask = ids[:max_tokens], mask[:max_tokens]
    return ids, mask


def render_for_completion(tokenizer: Tokenizer, messages: Any) -> list[int]:
    """Prompt ids that ask the model for the next assistant turn: drops a trailing assistant
    message (e.g. the reference answer in an eval set) and ends with <|assistant_start|>."""
    turns = normalize_messages(messages)  # validate before dropping anything
    if isinstance(messages, Mapping) and "messages" in messages:
        messages = messages["messages"]
    messages = list(messages)
    if turns[-1][0] == "assistant":
        messages = messages[:-1]
    ids, _ = render_conversation(tokenizer, messages)
    return [*ids, tokenizer.special_ids[ASSISTANT_START]]
