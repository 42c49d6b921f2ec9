"""`portachat chat --model PATH`: chat in the terminal."""

from __future__ import annotations

from portachat.commands.common import EPILOG, flag, later
from portachat.commands.inference import add_model_flags, add_sampling_flags
from portachat.i18n import _
from portachat.serve.fallbacks import CHAT_FALLBACK


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
    p.set_defaults(func=later("chat", "cmd_chat"))
