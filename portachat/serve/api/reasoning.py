"""Reasoning output: the part of a reply a thinking model writes before its answer, split off so that
each API shows it as such (`reasoning_content` / `reasoning` in chat completions, `thinking` blocks in
Anthropic messages, `reasoning` items in Responses).

Like tool calls, the format is per model family, read from the chat template:
- "think" (Qwen3, DeepSeek-R1 and their distillations, SmolLM3): `<think>…</think>` before the answer.
  Some templates open the block themselves (DeepSeek-R1's generation prompt ends with `<think>\\n`),
  so the reply starts inside it; `starts_inside` tells from the rendered prompt.
The split happens before tool-call parsing: calls and the answer's text come from what follows the
block."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from portachat.engine.structured import StructuredSpec
from portachat.engine.structured.compile import json_options
from portachat.i18n import _
from portachat.serve.api.errors import APIError
from portachat.tokenizer.protocol import ChatTokenizer

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


# Variables the server itself gives every chat template; a request may not replace them.
_TEMPLATE_OWN = frozenset({"messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token",
                           "pad_token", "unk_token"})


def template_variables(chat_template_kwargs: dict[str, Any] | None, reasoning_effort: str | None = None,
                       enable_thinking: bool | None = None) -> dict[str, Any]:
    """A request's extra chat-template variables: its chat_template_kwargs, plus `reasoning_effort`
    and `enable_thinking` when the API has its own field for them (400 on a name the server sets)."""
    variables = dict(chat_template_kwargs or {})
    taken = sorted(_TEMPLATE_OWN & set(variables))
    if taken:
        raise APIError(400, _("chat_template_kwargs may not set {names}: the server gives the template those "
                              "itself.").format(names=", ".join(taken)), param="chat_template_kwargs")
    if reasoning_effort is not None:
        variables.setdefault("reasoning_effort", reasoning_effort)
    if enable_thinking is not None:
        variables.setdefault("enable_thinking", enable_thinking)
    return variables


def reasoning_format(chat_template: str | None) -> str | None:
    """'think' when the chat template knows `<think>` blocks, else None (no reasoning to split)."""
    if chat_template and THINK_CLOSE in chat_template:
        return "think"
    return None


def starts_inside(prompt_text: str) -> bool:
    """Whether the prompt leaves a `<think>` block open, so the reply begins with reasoning."""
    tail = prompt_text.rstrip()
    return tail.endswith(THINK_OPEN)


@dataclass(frozen=True)
class Thinking:
    """How a request's reply is split: the model's reasoning format and whether its prompt left the
    block open. `Thinking(None)` splits nothing."""

    fmt: str | None = None
    inside: bool = False

    def split(self, text: str) -> tuple[str | None, str]:
        return split_reasoning(text, self.fmt, self.inside)

    def parser(self) -> StreamingReasoningParser:
        return StreamingReasoningParser(self.fmt, self.inside)


NO_THINKING = Thinking()  # a model that does not think: nothing is split off


def thinking_of(tokenizer: ChatTokenizer, prompt_ids: list[int]) -> Thinking:
    """The Thinking of a reply to `prompt_ids` rendered by `tokenizer`'s chat template."""
    fmt = reasoning_format(tokenizer.chat_template)
    if fmt is None:
        return NO_THINKING
    return Thinking(fmt, starts_inside(tokenizer.decode(prompt_ids[-8:])))


def after_reasoning(spec: StructuredSpec | None, thinking: Thinking) -> StructuredSpec | None:
    """A constraint (JSON schema, choice, regex, an enforced tool call) held to the answer only: a
    thinking model may first write its `<think>` block freely. A grammar a client wrote itself is
    left as it is (its start rule is its own), and so is every constraint for a model that does not think."""
    if spec is None or thinking.fmt != "think":
        return spec
    if spec.kind in ("json", "json_object"):
        schema = spec.value if spec.kind == "json" else {"type": "object"}
        schema = {} if schema is True else dict(schema)
        body = "answer: %json" + json.dumps({**schema, "x-guidance": json_options(spec.whitespace_pattern)})
    elif spec.kind == "choice":
        body = "answer: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in spec.value)
    elif spec.kind == "regex":
        body = "answer: /" + spec.value.replace("/", "\\/") + "/"
    elif spec.kind == "grammar" and spec.param == "tool_choice":  # ours (tool_calls.tool_call_spec)
        body = spec.value.replace("start:", "answer:", 1)
    else:
        return spec
    # The block's text ends at the first "</think>" (llguidance's suffix), then at most two newlines
    # (unbounded, a model trained to write "\n\n" then prose could write newlines to max_tokens).
    rules = ["start: think answer", "think: reasoning /\\n{0,2}/"] if thinking.inside else \
        ["start: think? answer", 'think: "<think>" reasoning /\\n{0,2}/']
    lark = "\n".join([*rules, 'reasoning[suffix="</think>"]: /(.|\\n)*/', body])
    return StructuredSpec("grammar", lark, param=spec.param)


def split_reasoning(text: str, fmt: str | None, inside: bool = False) -> tuple[str | None, str]:
    """(reasoning or None, answer) of a finished reply."""
    parser = StreamingReasoningParser(fmt, inside)
    reasoning, answer = parser.feed(text)
    more_reasoning, more_answer = parser.finish()
    return (reasoning + more_reasoning if parser.saw_reasoning else None), answer + more_answer


def _held_tail(text: str, tag: str) -> int:
    """How many characters at the end of `text` could be the start of `tag` (held back in a stream)."""
    return next((k for k in range(len(tag) - 1, 0, -1) if text.endswith(tag[:k])), 0)


class StreamingReasoningParser:
    """Splits streamed text into (reasoning delta, answer delta) pairs.

    A reply that begins (after whitespace) with `<think>` or that starts inside an open block is
    reasoning until `</think>`; everything after it is the answer. A reply with no block is all
    answer, passed on as it comes (only a possible `<think>` at its very start is held a moment)."""

    def __init__(self, fmt: str | None, inside: bool = False) -> None:
        self.fmt = fmt
        self.state = "reasoning" if (fmt and inside) else ("start" if fmt else "answer")
        self.saw_reasoning = self.trim = self.state == "reasoning"
        self.buffer = ""

    def feed(self, delta: str) -> tuple[str, str]:
        self.buffer += delta
        reasoning, answer = "", ""
        while self.buffer:
            if self.state == "start":
                stripped = self.buffer.lstrip()
                if stripped.startswith(THINK_OPEN):
                    self.buffer = stripped[len(THINK_OPEN):]
                    self.state, self.saw_reasoning, self.trim = "reasoning", True, True
                    continue
                if THINK_OPEN.startswith(stripped):  # maybe the tag, not complete yet
                    break
                self.state = "answer"
                continue
            if self.trim:  # the newlines templates put after a tag belong to neither part
                self.buffer = self.buffer.lstrip("\n")
                if not self.buffer:
                    break
                self.trim = False
            if self.state == "reasoning":
                end = self.buffer.find(THINK_CLOSE)
                if end < 0:
                    # Hold a tail that may start "</think>", and the newlines before it (they go
                    # with the tag, not the reasoning, if the tag follows).
                    cut = len(self.buffer) - _held_tail(self.buffer, THINK_CLOSE)
                    cut = len(self.buffer[:cut].rstrip("\n"))
                    reasoning += self.buffer[:cut]
                    self.buffer = self.buffer[cut:]
                    break
                reasoning += self.buffer[:end].rstrip("\n")
                self.buffer = self.buffer[end + len(THINK_CLOSE):]
                self.state, self.trim = "answer", True
                continue
            answer += self.buffer
            self.buffer = ""
        return reasoning, answer

    def finish(self) -> tuple[str, str]:
        """What is still held when the reply ends (an unclosed block stays reasoning)."""
        rest, self.buffer = self.buffer, ""
        if self.state == "reasoning":
            return rest, ""
        return "", rest
