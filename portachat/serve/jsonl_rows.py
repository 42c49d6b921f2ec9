"""JSONL rows with line numbers, resume and durable appends: what `portachat generate` and the
server's /v1/batches share. Both read the whole input before running anything (a bad line 9000
fails the run at once, naming its line), skip the ids an earlier run already wrote, and append one
finished row at a time (append + flush + fsync), so a crash loses at most the rows in flight and a
restart writes none twice."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from portachat.i18n import _


class BatchInputError(ValueError):
    """An input row that cannot be run; the message names the line, `reason` says what is wrong without it."""

    def __init__(self, message: str, line: int | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.line = line
        self.reason = reason


def json_line(raw: str, where: str, n: int) -> Any:
    """Line `n` parsed; BatchInputError naming it (`where:n`) when it is not JSON."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        error = exc.msg
    except RecursionError:  # arrays nested thousands deep
        error = "nested too deeply"
    reason = _("not valid JSON ({error})").format(error=error)
    raise BatchInputError(_("{where}: {error}").format(where=f"{where}:{n}", error=reason), line=n, reason=reason)


def done_ids(output: Path, key: str = "id") -> set[str]:
    """The `key` of every row already written; a trailing partial line (the process died mid-write)
    is cut off so that its row runs again."""
    if not output.exists():
        return set()
    data = output.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):  # incomplete last row: drop it so it is generated again
        with open(output, "r+b") as f:
            f.truncate(end)
            f.flush()
            os.fsync(f.fileno())
        data = data[:end]
    ids = set()
    for raw in data.decode("utf-8").splitlines():
        if raw.strip():
            ids.add(str(json.loads(raw)[key]))
    return ids


class RowWriter:
    """Appends one JSON line per finished row, durably, so a crash loses at most the row in flight."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, record: dict[str, Any]) -> None:
        self._f.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()
