"""`portachat chat --model PATH`: chat in the terminal."""

from __future__ import annotations

import argparse
import sys

from portachat.commands.common import EPILOG, flag
from portachat.commands.inference import add_model_flags, add_sampling_flags, load_options, sampling_params
from portachat.i18n import _
from portachat.serve.terminal_chat import CHAT_FALLBACK, ChatSession, chat_loop, stream_reply


def cmd_chat(args: argparse.Namespace) -> int:
    from portachat.engine.loading import load_served_model  # deferred: loads torch

    print("[portachat] " + _("loading {model} ...").format(model=args.model), file=sys.stderr, flush=True)
    served = load_served_model(load_options(args))
    print(f"[portachat] {served.description}", file=sys.stderr, flush=True)
    params = sampling_params(args, served.generation_defaults, CHAT_FALLBACK)
    if args.prompt is not None:  # one question, one answer: scripts and smoke tests
        session = ChatSession(params=params, system=args.system)
        session.messages.append({"role": "user", "content": args.prompt})
        _text, _ids, reason = stream_reply(served.engine, served.tokenizer, session, sys.stdout, line_start=True)
        print()
        return 0 if reason != "error" else 1
    chat_loop(served.engine, served.tokenizer, params, system=args.system)
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "chat", help=_("chat with a model in the terminal (streaming, multi-turn)"), epilog=EPILOG,
        description=_("Multi-turn chat in the terminal with streamed replies. Commands inside: /clear, /temperature X, "
                    "/max-tokens N, /system TEXT, /help, /quit. Ctrl-C stops the reply, not the program."),
    )
    add_model_flags(p, max_num_seqs=4)
    add_sampling_flags(p, CHAT_FALLBACK)
    flag(p, "--system", default=None, help=_("system prompt for the conversation"))
    flag(p, "--prompt", default=None, help=_("ask this one question, print the answer and exit (no interactive loop)"))
    p.set_defaults(func=cmd_chat)
