"""Batch jobs on disk, under PORTACHAT_HOME/batches/<batch id>/, beside the files they came from:

    batch.json     the job (status, timestamps, counts, owner), replaced atomically on every change
    input.jsonl    the input file as it was when the batch was created (deleting the file later
                   does not break a batch that resumes after a restart)
    output.jsonl   one line per request that answered 2xx, appended as each finishes
    errors.jsonl   one line per request that answered an error

A job belongs to the API key that created it (owner.py's id); another key sees none of it."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from portachat.storage.atomic import write_text_atomic
from portachat.storage.paths import portachat_home

COMPLETION_WINDOW_S = 24 * 3600  # OpenAI's only completion window, "24h"
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")  # a restart resumes these


@dataclass
class BatchJob:
    id: str
    owner: str
    admin: bool  # the key that created it was the admin key (a line's keep_alive needs that)
    endpoint: str
    input_file_id: str
    completion_window: str
    created_at: int
    metadata: dict[str, str] | None = None
    status: str = "validating"
    errors: list[dict[str, Any]] | None = None  # validation errors, each naming its input line
    output_file_id: str | None = None
    error_file_id: str | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    times: dict[str, int] = field(default_factory=dict)  # in_progress, finalizing, completed, failed, cancelling, ...

    def stamp(self, status: str) -> None:
        self.status = status
        self.times[status] = int(time.time())

    def openai(self) -> dict[str, Any]:
        """The Batch object of OpenAI's API."""
        t = self.times
        return {
            "id": self.id, "object": "batch", "endpoint": self.endpoint,
            "errors": {"object": "list", "data": self.errors} if self.errors else None,
            "input_file_id": self.input_file_id, "completion_window": self.completion_window,
            "status": self.status, "output_file_id": self.output_file_id, "error_file_id": self.error_file_id,
            "created_at": self.created_at, "in_progress_at": t.get("in_progress"),
            "expires_at": self.created_at + COMPLETION_WINDOW_S, "finalizing_at": t.get("finalizing"),
            "completed_at": t.get("completed"), "failed_at": t.get("failed"), "expired_at": t.get("expired"),
            "cancelling_at": t.get("cancelling"), "cancelled_at": t.get("cancelled"),
            "request_counts": {"total": self.total, "completed": self.completed, "failed": self.failed},
            "metadata": self.metadata,
        }


class BatchStore:
    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else portachat_home() / "batches"
        self._saving = threading.Lock()  # write_text_atomic's temporary name is per process, not per thread

    def directory(self, batch_id: str) -> Path:
        return self.root / batch_id

    def input_path(self, batch_id: str) -> Path:
        return self.directory(batch_id) / "input.jsonl"

    def output_path(self, batch_id: str) -> Path:
        return self.directory(batch_id) / "output.jsonl"

    def errors_path(self, batch_id: str) -> Path:
        return self.directory(batch_id) / "errors.jsonl"

    def create(self, job: BatchJob, data: bytes) -> None:
        """The job's directory with its input copy, then batch.json (a job without batch.json is not listed)."""
        directory = self.directory(job.id)
        directory.mkdir(parents=True, exist_ok=True)
        self.input_path(job.id).write_bytes(data)
        self.save(job)

    def save(self, job: BatchJob) -> None:
        with self._saving:
            write_text_atomic(self.directory(job.id) / "batch.json", json.dumps(asdict(job), ensure_ascii=False))

    def load_all(self) -> list[BatchJob]:
        """Every job on disk, oldest first."""
        if not self.root.is_dir():
            return []
        jobs = []
        for path in self.root.glob("*/batch.json"):
            try:
                jobs.append(BatchJob(**json.loads(path.read_text(encoding="utf-8"))))
            except (OSError, ValueError, TypeError):  # a foreign or damaged folder: not a job we can run
                continue
        return sorted(jobs, key=lambda j: (j.created_at, j.id))
