"""How `portachat chat` prints a streamed reply: the answer as it comes, and apart from it, on lines of
their own (indented, dimmed on a terminal), the model's reasoning and each calculator step:

    assistant>
      [calculator] 23+58 = 81
    答案：81。

The reply is split by the API's own `ReplySplitter` (calculator steps from the token ids, then
`<think>` reasoning from the text), so the terminal, the page and every API show one reply alike."""

from __future__ import annotations

import os
from typing import Any, TextIO

from portachat.i18n import _
from portachat.serve.api.calculator_steps import CalculatorStep, ReplySplitter
from portachat.serve.api.reasoning import Thinking

DIM, RESET = "\x1b[2m", "\x1b[0m"
INDENT = "  "


def wants_dim(out: TextIO) -> bool:
    """Dim the side text only on a terminal that takes escape codes (NO_COLOR turns it off: no-color.org)."""
    isatty = getattr(out, "isatty", None)
    return bool(isatty and isatty()) and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


class ReplyDisplay:
    """Feeds each engine output of one reply through the splitter and prints its parts.

    `line_start`: whether the cursor starts at the beginning of a line (`chat` prints "assistant> " first,
    `chat --prompt` nothing); a side block always begins on a line of its own."""

    def __init__(self, out: TextIO, tokenizer: Any, thinking: Thinking, line_start: bool = False,
                 dim: bool | None = None) -> None:
        self.out = out
        self.splitter = ReplySplitter(tokenizer, thinking)
        self.dim = wants_dim(out) if dim is None else dim
        self.line_start = line_start
        self.dimmed = False  # a DIM escape is in effect
        self.last: str | None = None  # what was printed last: "reasoning", "step" or "answer"

    def feed(self, text: str, token_ids: list[int], last: bool = False) -> None:
        """One output; `last`: the reply ends here (what the splitter still holds is printed)."""
        piece = self.splitter.feed(text, token_ids, last)
        if piece.reasoning:
            self._reasoning(piece.reasoning)
        for step in piece.steps:
            self._step(step)
        if piece.answer:
            if self.last in ("reasoning", "step"):  # the answer starts on a line of its own after them
                self._end_line()
            self._write(piece.answer)
            self.last = "answer"
        if last:
            self._write_plain()  # the terminal is not left dimmed (a reply cut inside its reasoning)
        self.out.flush()

    def _reasoning(self, text: str) -> None:
        if self.last != "reasoning":
            self._end_line()
            self._side(_("[thinking]") + " ")
            text = text.lstrip("\n")
        self._side(text)
        self.last = "reasoning"

    def _step(self, step: CalculatorStep) -> None:
        self._end_line()
        self._side(_("[calculator] {step}").format(step=step.readable()))
        self._write("\n")
        self.last = "step"

    def _side(self, text: str) -> None:
        """Side text: every line indented and dimmed (the dimming ends before each newline)."""
        for i, line in enumerate(text.split("\n")):
            if i:
                self._write("\n")
            if line:
                if self.line_start:
                    self._write(INDENT)
                self._write(line, dim=True)

    def _end_line(self) -> None:
        if not self.line_start:
            self._write("\n")

    def _write(self, text: str, dim: bool = False) -> None:
        if not text:
            return
        if dim and self.dim and not self.dimmed:
            self.out.write(DIM)
            self.dimmed = True
        elif not dim:
            self._write_plain()
        self.out.write(text)
        self.line_start = text.endswith("\n")

    def _write_plain(self) -> None:
        if self.dimmed:
            self.out.write(RESET)
            self.dimmed = False
