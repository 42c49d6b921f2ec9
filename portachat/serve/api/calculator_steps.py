"""The built-in calculator's work, taken out of the answer: our chat format's models write
`<|python_start|>23+58<|python_end|>`, the engine appends `<|output_start|>81<|output_end|>`, and the
reply's text would run `23+58` and `81` into the answer (control tokens have no text). From the
reply's token ids this splits each output into the answer's text and finished calculator steps,
which each API then shows as tool use: a readable `23+58 = 81` line in the reasoning channel (chat
completions' reasoning_content, Anthropic's thinking block, the page's step box) and a
`code_interpreter_call` item with its output in Responses.

`ReplySplitter` chains the two splits every route makes: calculator steps first (token level), then
reasoning (reasoning.py) on the text that is left."""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field
from typing import Any

from portachat.serve.api.reasoning import Thinking


@dataclass(frozen=True)
class CalculatorStep:
    expression: str
    result: str | None  # None: not plain arithmetic, the engine forced no result and the model went on

    def readable(self) -> str:
        return f"{self.expression} = {self.result}" if self.result is not None else self.expression


class CalculatorSplitter:
    """Per output: (answer text, finished steps). Outputs without tool tokens pass their text through.

    An output with tool tokens (several tokens at once: the forced result, speculative decoding) has
    its answer decoded here from the ids, through a UTF-8 decoder kept in step with the engine's: a
    character split across outputs is held, as the engine's text holds it, and comes out once."""

    def __init__(self, tokenizer: Any) -> None:
        self.tools = getattr(tokenizer, "tool_tokens", None)
        self.tokenizer = tokenizer
        self.ids = frozenset(vars(self.tools).values()) if self.tools is not None else frozenset()
        self.state = "answer"  # answer | expression | called | result
        self.expression: list[int] = []
        self.result: list[int] = []
        self.answer_bytes = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def _answer(self, run: list[int]) -> str:
        return self.answer_bytes.decode(b"".join(self.tokenizer.token_bytes(t) for t in run))

    def feed(self, text: str, token_ids: list[int]) -> tuple[str, list[CalculatorStep]]:
        if self.state == "answer" and not self.ids.intersection(token_ids):
            if self.tools is not None:
                self._answer(token_ids)  # the engine's text is the answer; only the held bytes matter
            return text, []
        t, decode = self.tools, self.tokenizer.decode
        answer, run, steps = "", [], []
        for token in token_ids:
            if self.state == "called" and token != t.output_start:  # refused: no result was forced
                steps.append(CalculatorStep(decode(self.expression), None))
                self.state = "answer"
            if self.state == "answer":
                if token == t.python_start:
                    answer, run = answer + self._answer(run), []
                    self.answer_bytes.reset()  # half a character before a call never completes
                    self.state, self.expression = "expression", []
                else:
                    run.append(token)
            elif self.state == "expression":
                if token == t.python_end:
                    self.state = "called"
                else:
                    self.expression.append(token)
            elif self.state == "called":
                self.state, self.result = "result", []
            elif token == t.output_end:
                steps.append(CalculatorStep(decode(self.expression), decode(self.result)))
                self.state = "answer"
            else:
                self.result.append(token)
        return answer + self._answer(run), steps

    def finish(self) -> list[CalculatorStep]:
        """A step the reply ended inside (cut by max_tokens, or a refused expression at the end)."""
        if self.state == "answer" or not self.expression:
            return []
        result = self.tokenizer.decode(self.result) if self.state == "result" else None
        step = CalculatorStep(self.tokenizer.decode(self.expression), result)
        self.state = "answer"
        return [step]


@dataclass
class ReplyPiece:
    """What one output adds to a reply: reasoning, answer text, calculator steps."""

    reasoning: str = ""
    answer: str = ""
    steps: list[CalculatorStep] = field(default_factory=list)


class ReplySplitter:
    """Calculator steps, then reasoning, out of a streamed reply."""

    def __init__(self, tokenizer: Any, thinking: Thinking) -> None:
        self.calculator = CalculatorSplitter(tokenizer)
        self.thoughts = thinking.parser()

    def feed(self, text: str, token_ids: list[int], last: bool = False) -> ReplyPiece:
        """One output's share; `last`: the reply ends here (whatever was held comes out)."""
        text, steps = self.calculator.feed(text, token_ids)
        reasoning, answer = self.thoughts.feed(text)
        if last:
            steps += self.calculator.finish()
            more_reasoning, more_answer = self.thoughts.finish()
            reasoning, answer = reasoning + more_reasoning, answer + more_answer
        return ReplyPiece(reasoning, answer, steps)

    @property
    def saw_reasoning(self) -> bool:
        return self.thoughts.saw_reasoning


def split_reply(tokenizer: Any, thinking: Thinking, pieces: list[tuple[str, list[int]]]
                ) -> tuple[str | None, str, list[CalculatorStep]]:
    """(reasoning or None, answer, calculator steps) of a finished reply, from its outputs' (text, token
    ids) in order: the same split its stream makes, output by output."""
    splitter = ReplySplitter(tokenizer, thinking)
    reasoning, answer, steps = "", "", []
    for i, (text, token_ids) in enumerate(pieces or [("", [])]):
        piece = splitter.feed(text, token_ids, last=i == max(len(pieces), 1) - 1)
        reasoning, answer, steps = reasoning + piece.reasoning, answer + piece.answer, steps + piece.steps
    return (reasoning if splitter.saw_reasoning else None), answer, steps


def with_steps(reasoning: str | None, steps: list[CalculatorStep]) -> str | None:
    """The reasoning channel's text with the calculator's steps as readable lines after it."""
    if not steps:
        return reasoning
    lines = "\n".join(step.readable() for step in steps)
    return f"{reasoning}\n{lines}" if reasoning else lines
