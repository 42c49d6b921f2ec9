"""The one check of a request's length against the context window, and the reply budget it leaves.

The engine runs `check_context` on every request it admits; an interface that lets the reply use
"whatever room the context leaves" (the API's unset max_tokens, `chat`) asks `reply_budget` first,
so both see the same rule and the same refusal. A refusal is a `ContextLengthError` that carries
its numbers, so the API can word it in its own fields (messages, max_completion_tokens, ...)."""

from __future__ import annotations

from portachat.engine.errors import EngineError
from portachat.i18n import _


class ContextLengthError(EngineError):
    """The prompt (with `max_tokens` for the reply; None: the prompt alone) does not fit `limit` tokens."""

    def __init__(self, prompt_tokens: int, max_tokens: int | None, limit: int) -> None:
        if max_tokens is None:
            message = _("the prompt ({tokens} tokens) fills the context window of {window} tokens; shorten it or "
                        "raise --max-model-len").format(tokens=prompt_tokens, window=limit)
        else:
            message = _("the prompt has {prompt} tokens and max_tokens is {max_tokens}: {total} > the context window "
                        "of {window} tokens; shorten the prompt, lower max_tokens, or raise --max-model-len").format(
                prompt=prompt_tokens, max_tokens=max_tokens, total=prompt_tokens + max_tokens, window=limit)
        super().__init__(message, kind="too_long")
        self.prompt_tokens, self.max_tokens, self.limit = prompt_tokens, max_tokens, limit


def check_context(prompt_tokens: int, max_tokens: int | None, limit: int) -> None:
    """ContextLengthError unless the prompt leaves room for a reply and, when `max_tokens` is given, for
    that many tokens."""
    if prompt_tokens >= limit:
        raise ContextLengthError(prompt_tokens, None, limit)
    if max_tokens is not None and prompt_tokens + max_tokens > limit:
        raise ContextLengthError(prompt_tokens, max_tokens, limit)


def reply_budget(prompt_tokens: int, max_tokens: int | None, limit: int, cap: int | None = None) -> int:
    """The reply's max_tokens: the one asked for (checked), else the room the context leaves (at most
    `cap`, an interface's default such as --max-tokens), as vLLM does."""
    check_context(prompt_tokens, max_tokens, limit)
    if max_tokens is not None:
        return max_tokens
    room = limit - prompt_tokens
    return room if cap is None else min(room, cap)
