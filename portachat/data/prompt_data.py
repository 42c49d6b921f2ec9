"""Prompts for GRPO (`train rl --data`), with the columns its reward functions read.

Accepted rows (jsonl lines or parquet rows), TRL's prompt-only formats plus our chat files:
  {"prompt": "text"}                         plain: the reply continues the text as it is
  {"prompt": [{"role", "content"}, ...]}     conversational: rendered with the model's chat template
  {"messages": [...]}                        conversational (a trailing assistant turn is dropped)
  {"question": "...", "answer": "..."}       GSM8K and the like: the question is the user's turn
Every other key (e.g. "answer") is a column passed to the rewards by name, as TRL passes dataset
columns to reward functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from portachat.data.chat_data import chat_files, data_rows
from portachat.data.document_source import DataError
from portachat.i18n import _
from portachat.tokenizer.chat import normalize_messages
from portachat.tokenizer.errors import ChatFormatError

PROMPT_KEYS = ("prompt", "messages", "question")


@dataclass
class PromptRow:
    prompt: str | list[dict[str, Any]]  # plain text, or the conversation so far (TRL's two formats)
    columns: dict[str, Any] = field(default_factory=dict)  # the row's other keys, for the rewards

    @property
    def conversational(self) -> bool:
        return not isinstance(self.prompt, str)


def _messages(value: Any, where: str) -> list[dict[str, Any]]:
    try:
        normalize_messages(value)  # fail here, naming the row, not in the middle of training
    except ChatFormatError as exc:
        raise DataError(_("{where}: {error}").format(where=where, error=exc)) from None
    messages = [dict(m) for m in value]
    if messages[-1].get("role") == "assistant":  # a reference reply: the model writes its own
        messages = messages[:-1]
    if not messages:
        raise DataError(_("{where}: the conversation has no turn before the assistant's reply").format(where=where))
    return messages


def row_to_prompt(row: Any, where: str = "row") -> PromptRow:
    """One row in an accepted format -> PromptRow; raises DataError naming `where` otherwise."""
    if not isinstance(row, Mapping):
        raise DataError(_("{where}: expected a JSON object, got {type}").format(where=where, type=type(row).__name__))
    key = next((k for k in PROMPT_KEYS if k in row), None)
    columns = {k: v for k, v in row.items() if k != key}
    value = row.get(key)
    if key == "prompt" and isinstance(value, str) and value:
        return PromptRow(value, columns)
    if key in ("prompt", "messages") and isinstance(value, Sequence) and not isinstance(value, str):
        return PromptRow(_messages(value, where), columns)
    if key == "question" and isinstance(value, str) and value:
        return PromptRow([{"role": "user", "content": value}], columns)
    raise DataError(_("{where}: not a prompt. Expected 'prompt' (text or a list of messages), 'messages' or "
                      "'question'; got keys {keys}").format(where=where, keys=sorted(row)[:8]))


def load_prompts(specs: Sequence[str | Path], limit: int | None = None) -> list[PromptRow]:
    """Every prompt in the files `specs` name (files, directories or hf:OWNER/NAME), in order."""
    out: list[PromptRow] = []
    for spec in specs:
        for file in chat_files(spec):
            for where, row in data_rows(file):
                out.append(row_to_prompt(row, where))
                if limit is not None and len(out) >= limit:
                    return out
    if not out:
        raise DataError(_("--data {spec}: no prompts found").format(spec=", ".join(map(str, specs))))
    return out
