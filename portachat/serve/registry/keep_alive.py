"""Ollama's keep-alive: how long a model stays loaded after its last request.

A duration string ("30s", "5m", "1h30m", "250ms"), a number of seconds, 0 = unload as soon as the
request ends, any negative value = keep loaded until evicted or unloaded by hand.
"""

from __future__ import annotations

import re

from portachat.i18n import _

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")


def parse_keep_alive(value: str | int | float) -> float | None:
    """Seconds to keep a model after its last request; None = forever. ValueError on bad input."""
    if isinstance(value, bool):
        raise ValueError(_("keep_alive must be a duration like '5m' or a number of seconds, got {value!r}").format(
                           value=value))
    if isinstance(value, int | float):
        return None if value < 0 else float(value)
    text = str(value).strip().lower()
    try:
        number = float(text)
    except ValueError:
        pass
    else:
        return None if number < 0 else number
    if text.startswith("-") and _PART.fullmatch(text[1:]):
        return None
    pos, total = 0, 0.0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise ValueError(_("keep_alive must be a duration like '30s', '5m', '1h' or a number of seconds (0 "
                           "= unload after the request, -1 = keep loaded), got {value!r}").format(value=value))
    return total


def describe_keep_alive(seconds: float | None) -> str:
    if seconds is None:
        return "kept loaded"
    if seconds == 0:
        return "unloaded after each request"
    return f"unloaded after {seconds:g} s idle"


def keeps_longer(a: float | None, b: float | None) -> bool:
    """Whether keep-alive `a` keeps a model loaded longer than `b` (None = forever)."""
    if a is None:
        return b is not None
    return b is not None and a > b
