"""`portachat chat --model PATH`: chat in the terminal.

What runs. The flags are in commands/chat.py, which `--help` imports without torch."""

from __future__ import annotations

import argparse
import sys

from portachat.commands.run.inference import load_options, sampling_params
from portachat.engine.loading import load_served_model
from portachat.i18n import _
from portachat.serve.fallbacks import CHAT_FALLBACK
from portachat.serve.terminal_chat import ChatSession, chat_loop, stream_reply


def cmd_chat(args: argparse.Namespace) -> int:
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
