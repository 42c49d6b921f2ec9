"""Stored responses (`store: true` on POST /v1/responses) under PORTACHAT_HOME/responses, beside the
document store: one SQLite database (`responses.sqlite`), owned by the API key that made them
(serve/api/owner.py).

A stored response keeps three things: the response object GET /v1/responses/{id} returns, the input
items GET .../input_items lists, and the whole conversation up to and including its output
(`history`), so a later request's `previous_response_id` continues it without walking a chain. They
sit in one JSON `body` column beside the columns the lookups read (id, owner, age, size): opening the
store reads no body, an owner check reads none, a read parses one. SQLite makes each write atomic.

Bounded like every cache the server keeps: at most `max_count` responses and `max_bytes` of bodies;
past either the oldest responses are dropped first (they are conversation state a client can resend,
not documents), and one response larger than `max_item_bytes` is not stored at all (the reply still
goes out; its `store` says false).

Stores written before the database (one `resp_*.json` file per response) are moved into it when the
store opens, once; files this store did not write are left alone."""

from __future__ import annotations

import json
import re
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from portachat.storage.paths import portachat_home

MAX_COUNT = 10_000
MAX_BYTES = 1 * 2**30
MAX_ITEM_BYTES = 16 * 2**20
_ID = re.compile(r"resp_[0-9a-f]{32}")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, created_at REAL NOT NULL, size INTEGER NOT NULL, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS responses_by_age ON responses (created_at);
"""


@dataclass
class StoredResponse:
    owner: str
    response: dict[str, Any]
    input_items: list[dict[str, Any]]
    history: list[dict[str, Any]]


def _body(stored: StoredResponse) -> str:
    return json.dumps({"owner": stored.owner, "response": stored.response, "input_items": stored.input_items,
                       "history": stored.history}, ensure_ascii=False)


class ResponseStore:
    """Responses in SQLite, opened on first use; safe across threads (one connection behind a lock)."""

    def __init__(self, root: Path | None = None, max_count: int = MAX_COUNT, max_bytes: int = MAX_BYTES,
                 max_item_bytes: int = MAX_ITEM_BYTES) -> None:
        self.root = Path(root) if root is not None else portachat_home() / "responses"
        self.max_count, self.max_bytes, self.max_item_bytes = max_count, max_bytes, max_item_bytes
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None

    def _open(self) -> sqlite3.Connection:
        if self._db is None:
            self.root.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.root / "responses.sqlite", check_same_thread=False, timeout=30,
                                 isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(_SCHEMA)
            self._db = db
            self._migrate_files()
        return self._db

    def _migrate_files(self) -> None:
        """The one-file-per-response layout into the database (each file read once, then removed)."""
        for path in sorted(self.root.glob("resp_*.json")):
            if not _ID.fullmatch(path.stem):
                continue
            try:
                text = path.read_text(encoding="utf-8")
                data = json.loads(text)
                stored = StoredResponse(str(data["owner"]), data["response"], data["input_items"], data["history"])
                created = stored.response.get("created_at")
                created = float(path.stat().st_mtime if created is None else created)
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue  # a file this store did not write: leave it alone
            self._insert(path.stem, stored.owner, created, text, len(text.encode()))
            path.unlink()
        self._evict()

    def _insert(self, response_id: str, owner: str, created_at: float, body: str, size: int) -> None:
        self._db.execute("INSERT OR REPLACE INTO responses (id, owner, created_at, size, body) VALUES (?, ?, ?, ?, ?)",
                         (response_id, owner, created_at, size, body))

    def put(self, stored: StoredResponse) -> bool:
        """Store (or replace) a response; False when it is too large to keep."""
        response_id = stored.response["id"]
        body = _body(stored)
        size = len(body.encode())  # what the byte bounds count
        if size > self.max_item_bytes or not _ID.fullmatch(response_id):
            return False
        with self._lock:
            self._open()
            self._insert(response_id, stored.owner, float(stored.response.get("created_at", 0)), body, size)
            self._evict()
        return True

    def _evict(self) -> None:
        db = self._db
        count, total = db.execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM responses").fetchone()
        if count <= self.max_count and total <= self.max_bytes:
            return
        victims = []
        for response_id, size in db.execute("SELECT id, size FROM responses ORDER BY created_at, rowid"):
            if count <= self.max_count and total <= self.max_bytes:
                break
            victims.append((response_id,))
            count, total = count - 1, total - size
        db.executemany("DELETE FROM responses WHERE id = ?", victims)

    def owner_of(self, response_id: str) -> str | None:
        """The owner of a stored response, None when there is none (its body is not read)."""
        with self._lock:
            row = self._open().execute("SELECT owner FROM responses WHERE id = ?", (response_id,)).fetchone()
        return row[0] if row else None

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            row = self._open().execute("SELECT body FROM responses WHERE id = ?", (response_id,)).fetchone()
        if row is None:
            return None
        data = json.loads(row[0])
        return StoredResponse(data["owner"], data["response"], data["input_items"], data["history"])

    def delete(self, response_id: str) -> bool:
        with self._lock:
            gone = self._open().execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount
        return gone > 0

