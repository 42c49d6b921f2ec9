"""The device layer's small JSON caches (calibrated peaks, attention timings, the CPU bf16 probe): one
reader and one merge-writer. Ranks of one job share these files, so a merge holds a file lock around
read-modify-write, and the write itself is atomic (storage/atomic.py): a reader sees the old or the new
file, and no rank's entry is lost to another's concurrent merge."""

from __future__ import annotations

import json
from pathlib import Path

from filelock import FileLock

from portachat.storage.atomic import write_text_atomic

LOCK_TIMEOUT_S = 30.0  # a cache entry is a nicety: give up (and skip the write) rather than hang a rank


def read_json(path: Path) -> dict:
    """The cache's entries; {} when it is missing, unreadable or not a JSON object."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def merge_json_entry(path: Path, key: str, entry: object) -> None:
    """Add or replace one entry of the cache at `path`, keeping every other entry."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT_S):
        data = read_json(path)
        data[key] = entry
        write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True))
