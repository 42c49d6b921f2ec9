"""How `portachat chat` shows a reply: the answer clean, and apart from it, on lines of their own, the
calculator's steps and the model's reasoning (split by the API's ReplySplitter); the conversation the
model sees next turn still holds its tool call and result tokens."""

from __future__ import annotations

import codecs
import io
from dataclasses import dataclass, field

import pytest
from calculator_model import ANSWER, QUESTION, STEP, calculator_reply, chat_tokenizer, train_calculator_model

from portachat.engine import SamplingParams
from portachat.engine.types import RequestOutput
from portachat.model.model_dir import save_model_files
from portachat.serve.api.reasoning import NO_THINKING, Thinking
from portachat.serve.chat_display import DIM, RESET, ReplyDisplay
from portachat.serve.terminal_chat import chat_loop
from tests.e2e.helpers import run_cli

SHOWN = f"\n  [calculator] {STEP}\n{ANSWER}"  # after "assistant> "


def _outputs(tok, ids: list[int], sizes: list[int]) -> list[tuple[str, list[int]]]:
    """`ids` cut into outputs of `sizes` tokens (the last takes the rest), each with the text the
    engine's incremental detokenizer gives it (control tokens have no bytes; half a character waits)."""
    decoder, outputs, at = codecs.getincrementaldecoder("utf-8")(errors="replace"), [], 0
    for size in [*sizes, len(ids)]:
        chunk, at = ids[at:at + size], at + size
        if chunk:
            outputs.append(("".join(decoder.decode(tok.token_bytes(t)) for t in chunk), chunk))
    return outputs


def _show(tok, outputs: list[tuple[str, list[int]]], thinking: Thinking = NO_THINKING, dim: bool = False) -> str:
    out = io.StringIO()
    display = ReplyDisplay(out, tok, thinking, dim=dim)
    for i, (text, ids) in enumerate(outputs):
        display.feed(text, ids, last=i == len(outputs) - 1)
    return out.getvalue()


def test_the_step_is_shown_on_its_own_line_and_the_answer_is_clean(small_tokenizer):
    tok, reply = chat_tokenizer(small_tokenizer), calculator_reply(small_tokenizer)
    assert "".join(text for text, _ids in _outputs(tok, reply, [])) == "23+5881" + ANSWER  # what was shown before
    assert _show(tok, _outputs(tok, reply, [1] * len(reply))) == SHOWN  # one token per output


def test_a_step_whose_tokens_arrive_in_one_output_is_shown_whole(small_tokenizer):
    # Speculative decoding accepts several tokens in one step: markers in the middle of an output.
    tok, reply = chat_tokenizer(small_tokenizer), calculator_reply(small_tokenizer)
    closes = reply.index(tok.tool_tokens.output_end)
    assert _show(tok, _outputs(tok, reply, [len(reply)])) == SHOWN  # the whole reply in one output
    assert _show(tok, _outputs(tok, reply, [2, closes])) == SHOWN  # "3+58 = 81" and the answer's start in one
    assert _show(tok, _outputs(tok, reply, [1, 3, closes - 3])) == SHOWN


def test_reasoning_is_shown_apart_before_the_answer(small_tokenizer):
    tok = chat_tokenizer(small_tokenizer)
    text = "<think>\nthe fox\nis quick\n</think>\n\nhello there"
    outputs = [(text[i:i + 3], []) for i in range(0, len(text), 3)]  # tags split across outputs
    assert _show(tok, outputs, Thinking("think")) == "\n  [thinking] the fox\n  is quick\nhello there"
    dimmed = _show(tok, outputs, Thinking("think"), dim=True)
    assert dimmed.endswith(f"{RESET}\nhello there") and f"  {DIM}is quick{RESET}" in dimmed
    assert _show(tok, [("hello there", [])], Thinking("think"), dim=True) == "hello there"  # no block, nothing apart
    cut = _show(tok, [("<think>\nstill thinking", [])], Thinking("think"), dim=True)  # max_tokens, Ctrl-C
    assert cut == f"\n  {DIM}[thinking] still thinking{RESET}"  # the terminal is not left dimmed


@dataclass
class ScriptedEngine:
    """Just enough of an engine for chat_loop: each request answers with the scripted outputs' ids."""

    tok: object
    sizes: list[int]
    reply: list[int]
    max_model_len: int = 256
    prompts: list[list[int]] = field(default_factory=list)
    pending: list[RequestOutput] = field(default_factory=list)

    def add_request(self, prompt: list[int], params: SamplingParams) -> str:
        self.prompts.append(prompt)
        outputs = _outputs(self.tok, self.reply, self.sizes)
        self.pending = [RequestOutput("r", text, ids, finished=i == len(outputs) - 1,
                                      finish_reason="stop" if i == len(outputs) - 1 else None)
                        for i, (text, ids) in enumerate(outputs)]
        return "r"

    def step(self) -> list[RequestOutput]:
        return [self.pending.pop(0)]

    def has_unfinished(self) -> bool:
        return bool(self.pending)


def test_chat_shows_the_step_apart_and_the_model_still_sees_its_tool_call(small_tokenizer):
    tok, reply = chat_tokenizer(small_tokenizer), calculator_reply(small_tokenizer)
    engine = ScriptedEngine(tok, [4, 9], reply)  # the step ends inside the second output
    lines, out = iter([QUESTION, "again", "/quit"]), io.StringIO()
    chat_loop(engine, tok, SamplingParams(max_tokens=40), read_line=lambda _prompt: next(lines), out=out)
    assert out.getvalue().count(f"assistant> {SHOWN}\n") == 2
    first_turn = tok.render_prompt([{"role": "user", "content": QUESTION}])
    assert engine.prompts[1][len(first_turn):len(first_turn) + len(reply)] == reply  # tool tokens and all


@pytest.mark.slow
def test_chat_command_shows_the_calculator_step_apart(tmp_path, small_tokenizer):
    _tok, model = train_calculator_model(small_tokenizer)
    path = tmp_path / "step_000060"
    path.mkdir()
    save_model_files(path, model, small_tokenizer, {"stage": "sft", "step": 60})
    proc = run_cli(["chat", "--model", str(path), "--prompt", QUESTION, "--max-tokens", "40", "--temperature", "0",
                    "--dtype", "fp32", "--speculative-model", "ngram", "--num-speculative-tokens", "4"],
                   tmp_path / "home", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"  [calculator] {STEP}\n{ANSWER}\n"
