"""`portachat chat`: a multi-turn chat in the terminal, streamed token by token (the answer apart from
reasoning and calculator steps: chat_display.py). The conversation keeps each reply as the model wrote
it, tool calls and results included, so later turns show the model its own steps.

Commands: /clear (forget the conversation), /temperature X, /max-tokens N, /system TEXT, /help,
/quit. Ctrl-C while the model answers stops that answer (its partial text stays in the
conversation) and returns to the prompt; Ctrl-C or Ctrl-D at the prompt quits.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TextIO

from portachat.engine.limits import reply_budget
from portachat.engine.sampling_params import TEMPERATURE_MAX, SamplingError, with_fields
from portachat.engine.types import EngineError, SamplingParams
from portachat.i18n import N_, _, gettext
from portachat.serve.api.reasoning import thinking_of
from portachat.serve.chat_display import ReplyDisplay
from portachat.tokenizer.protocol import ChatTokenizer

HELP = N_("""commands:
  /clear            start a new conversation
  /temperature X    sampling temperature (0 = greedy)
  /max-tokens N     longest reply, in tokens
  /system TEXT      set a system prompt (empty TEXT removes it); starts a new conversation
  /help             this text
  /quit             leave (also Ctrl-D)
Ctrl-C while the model answers stops the answer.""")


@dataclass
class ChatSession:
    """The conversation so far plus the settings the slash commands change."""

    params: SamplingParams
    system: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)

    def history(self) -> list[dict[str, Any]]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.messages


def reply_parts(tokenizer: ChatTokenizer, ids: list[int]) -> list[dict[str, str]] | str:
    """An assistant reply's ids as message content: plain text, or parts when it used the calculator
    (so the next turn renders the tool call and its output exactly as the model saw them)."""
    tools = tokenizer.tool_tokens
    stops = tokenizer.stop_ids
    ids = [t for t in ids if t not in stops]
    if tools is None or not any(t in (tools.python_start, tools.output_start) for t in ids):
        return tokenizer.decode(ids)
    parts: list[dict[str, str]] = []
    kind, current = "text", []

    def flush() -> None:
        if current or kind != "text":
            parts.append({"type": kind, "text": tokenizer.decode(current)})

    for t in ids:
        if t in (tools.python_start, tools.output_start):
            flush()
            kind, current = ("python" if t == tools.python_start else "python_output"), []
        elif t in (tools.python_end, tools.output_end):
            flush()
            kind, current = "text", []
        else:
            current.append(t)
    if current:
        flush()
    return [p for p in parts if p["text"] or p["type"] != "text"]


def handle_command(line: str, session: ChatSession, out: TextIO) -> bool:
    """Apply a slash command; returns False when the user asked to quit."""
    name, _sep, arg = line.strip().partition(" ")
    arg = arg.strip()
    if name in ("/quit", "/exit"):
        return False
    if name == "/clear":
        session.messages.clear()
        print(_("(conversation cleared)"), file=out)
    elif name == "/temperature":
        try:
            session.params = with_fields(session.params, {"temperature": float(arg)})
        except (ValueError, SamplingError):  # not a number, or out of the one sampling check's range
            print(_("/temperature needs a number from 0 to {high}, e.g. /temperature 0.7 (now {value})").format(
                high=f"{TEMPERATURE_MAX:g}", value=session.params.temperature), file=out)
        else:
            print(_("(temperature {value})").format(value=session.params.temperature), file=out)
    elif name == "/max-tokens":
        try:
            session.params = with_fields(session.params, {"max_tokens": int(arg) if arg.isdigit() else arg})
        except SamplingError:
            print(_("/max-tokens needs a positive integer (now {value})").format(value=session.params.max_tokens), file=out)
        else:
            print(_("(max tokens {value})").format(value=session.params.max_tokens), file=out)
    elif name == "/system":
        session.system = arg or None
        session.messages.clear()
        print(_("(system prompt set; conversation cleared)") if arg else _("(system prompt removed)"), file=out)
    elif name == "/help":
        print(gettext(HELP), file=out)
    else:
        print(_("unknown command {name}; /help lists them").format(name=name), file=out)
    return True


def stream_reply(engine, tokenizer: ChatTokenizer, session: ChatSession, out: TextIO,
                 line_start: bool = False) -> tuple[str, list[int], str]:
    """Run one assistant turn, printing it as it arrives: the answer, and apart from it the reasoning
    and calculator steps (chat_display.py; `line_start`: nothing precedes it on the line). Returns the
    raw (text, ids, finish reason), tool tokens and reasoning included, for the conversation; Ctrl-C
    aborts the request and returns what was produced so far with reason "abort"."""
    prompt = tokenizer.render_prompt(session.history())
    # A reply may use whatever room the context leaves, up to --max-tokens (ContextLengthError when none).
    max_tokens = reply_budget(len(prompt), None, engine.max_model_len, cap=session.params.max_tokens)
    display = ReplyDisplay(out, tokenizer, thinking_of(tokenizer, prompt), line_start=line_start)
    rid = engine.add_request(prompt, replace(session.params, max_tokens=max_tokens))
    texts: list[str] = []
    ids: list[int] = []
    try:
        while True:
            for o in engine.step():
                if o.request_id != rid:
                    continue
                texts.append(o.text)
                ids.extend(o.token_ids)
                display.feed(o.text, o.token_ids, last=o.finished)
                if o.finished:
                    if o.error:
                        out.write(f"\n[error] {o.error}")
                    return "".join(texts), ids, o.finish_reason or "stop"
    except KeyboardInterrupt:
        engine.abort(rid)
        while engine.has_unfinished():  # let the engine settle so the next turn starts clean
            engine.step()
        display.feed("", [], last=True)  # what the splitter held back (a partial tag, an unfinished step)
        out.write(" [stopped]")
        return "".join(texts), ids, "abort"


def chat_loop(
    engine,
    tokenizer: ChatTokenizer,
    params: SamplingParams,
    system: str | None = None,
    read_line: Callable[[str], str] = input,
    out: TextIO = sys.stdout,
) -> None:
    session = ChatSession(params=params, system=system)
    print(_("portachat chat - /help for commands, Ctrl-C stops a reply, /quit or Ctrl-D leaves"), file=out)
    while True:
        try:
            line = read_line("\nyou> ")
        except (EOFError, KeyboardInterrupt):
            print(file=out)
            return
        if not line.strip():
            continue
        if line.startswith("/"):
            if not handle_command(line, session, out):
                return
            continue
        session.messages.append({"role": "user", "content": line})
        out.write("assistant> ")
        out.flush()
        try:
            _text, ids, reason = stream_reply(engine, tokenizer, session, out)
        except EngineError as exc:
            session.messages.pop()
            print(f"\n[error] {exc}" + (" " + _("(try /clear)") if exc.kind == "too_long" else ""), file=out)
            continue
        print(file=out)
        if reason == "length":
            print(_("[reply cut at {n} tokens; /max-tokens N for longer]").format(n=session.params.max_tokens), file=out)
        session.messages.append({"role": "assistant", "content": reply_parts(tokenizer, ids)})
