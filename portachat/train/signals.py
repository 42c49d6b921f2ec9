"""Ctrl-C / SIGTERM during training: finish the step, save, stop (never mid-write)."""

from __future__ import annotations

import signal
from typing import Any

from portachat.i18n import _


class StopRequest:
    """SIGINT/SIGTERM ask the loop to save and stop at the next step boundary; a second one stops now."""

    def __init__(self) -> None:
        self.requested = False
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (e.g. tests): leave signals alone
                pass
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested:  # a second Ctrl-C means now
            raise KeyboardInterrupt
        self.requested = True
        print("\n[portachat] " + _("signal {signum}: saving a checkpoint at the end of this step, then stopping").format(
            signum=signum), flush=True)

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
