"""Where portachat keeps its files: one home directory, overridable for tests and clusters."""

from __future__ import annotations

import os
from pathlib import Path


def portachat_home() -> Path:
    """`$PORTACHAT_HOME` if set, else `~/.cache/portachat`. Not created here; writers create what they need."""
    env = os.environ.get("PORTACHAT_HOME")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "portachat"
