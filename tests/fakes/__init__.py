"""Stand-ins for vendor modules this machine does not have, implementing their documented semantics."""

from __future__ import annotations

from portachat.device import fast_paths
from portachat.ops import fast_path


def forget_fast_path_answers() -> None:
    """As a new process starts: no verdict or answer in memory (the file cache stays)."""
    fast_paths.forget()
    fast_path.forget_all()
