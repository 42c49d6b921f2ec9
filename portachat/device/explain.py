"""Turn a known failure into what happened and what to do; the CLI shows this instead of a traceback.

The vendor knowledge (error texts, environment variables) lives in portachat.device.errors.
"""

from __future__ import annotations

from portachat.device.errors import Diagnosis
from portachat.device.errors import diagnose as _diagnose
from portachat.i18n import _

__all__ = ["Diagnosis", "diagnose", "format_diagnosis"]


def diagnose(exc: BaseException) -> Diagnosis | None:
    """A Diagnosis for a recognised exception (or one in its cause chain); None when unknown."""
    return _diagnose(exc)


def format_diagnosis(d: Diagnosis) -> str:
    """Plain text for a terminal: title, what happened, numbered remedies."""
    lines = [_("error: {title}").format(title=d.title), f"  {d.what_happened}"]
    if d.remedies:
        lines.append("  " + _("what to do:"))
        lines += [f"    {i}. {remedy}" for i, remedy in enumerate(d.remedies, 1)]
    lines.append("  " + _("(rerun with --debug for the full traceback)"))
    return "\n".join(lines)
