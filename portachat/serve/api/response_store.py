"""Stored responses (`store: true` on POST /v1/responses) under PORTACHAT_HOME/responses, beside the
document store: one JSON file per response, written atomically (storage/atomic.py), owned by the API
key that made it (serve/api/owner.py).

A stored response keeps three things: the response object GET /v1/responses/{id} returns, the input
items GET .../input_items lists, and the whole conversation up to and including its output
(`history`), so a later request's `previous_response_id` continues it without walking a chain.

Bounded like every cache the server keeps: at most `max_count` responses and `max_bytes` on disk;
past either the oldest responses are dropped first (they are conversation state a client can resend,
not documents), and one response larger than `max_item_bytes` is not stored at all (the reply still
goes out; its `store` says false)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from portachat.storage.atomic import write_text_atomic
from portachat.storage.paths import portachat_home

MAX_COUNT = 10_000
MAX_BYTES = 1 * 2**30
MAX_ITEM_BYTES = 16 * 2**20
_ID = re.compile(r"resp_[0-9a-f]{32}")


@dataclass
class _Entry:
    owner: str
    size: int
    created_at: float


@dataclass
class StoredResponse:
    owner: str
    response: dict[str, Any]
    input_items: list[dict[str, Any]]
    history: list[dict[str, Any]]


class ResponseStore:
    """Responses on disk with an in-memory index (id -> owner, size, age), safe across threads."""

    def __init__(self, root: Path | None = None, max_count: int = MAX_COUNT, max_bytes: int = MAX_BYTES,
                 max_item_bytes: int = MAX_ITEM_BYTES) -> None:
        self.root = Path(root) if root is not None else portachat_home() / "responses"
        self.max_count, self.max_bytes, self.max_item_bytes = max_count, max_bytes, max_item_bytes
        self._lock = threading.Lock()
        self._index: dict[str, _Entry] = {}
        self._loaded = False

    def _load_index(self) -> None:
        if self._loaded:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        for path in self.root.glob("resp_*.json"):
            if not _ID.fullmatch(path.stem):
                continue
            try:
                with open(path, encoding="utf-8") as f:
                    owner = json.load(f)["owner"]
                self._index[path.stem] = _Entry(str(owner), path.stat().st_size, path.stat().st_mtime)
            except (OSError, ValueError, KeyError, TypeError):
                continue  # a file this store did not write: leave it alone
        self._loaded = True

    def _path(self, response_id: str) -> Path:
        return self.root / f"{response_id}.json"

    def put(self, stored: StoredResponse) -> bool:
        """Store (or replace) a response; False when it is too large to keep."""
        response_id = stored.response["id"]
        text = json.dumps({"owner": stored.owner, "response": stored.response, "input_items": stored.input_items,
                           "history": stored.history}, ensure_ascii=False)
        size = len(text.encode())
        if size > self.max_item_bytes or not _ID.fullmatch(response_id):
            return False
        with self._lock:
            self._load_index()
            write_text_atomic(self._path(response_id), text)
            self._index[response_id] = _Entry(stored.owner, size, float(stored.response.get("created_at", 0)))
            self._evict()
        return True

    def _evict(self) -> None:
        total = sum(e.size for e in self._index.values())
        oldest = sorted(self._index, key=lambda k: self._index[k].created_at)
        while oldest and (len(self._index) > self.max_count or total > self.max_bytes):
            victim = oldest.pop(0)
            total -= self._index.pop(victim).size
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(victim))

    def owner_of(self, response_id: str) -> str | None:
        """The owner of a stored response, None when there is none."""
        with self._lock:
            self._load_index()
            entry = self._index.get(response_id)
            return entry.owner if entry else None

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            self._load_index()
            if response_id not in self._index:
                return None
            try:
                with open(self._path(response_id), encoding="utf-8") as f:
                    data = json.load(f)
            except (OSError, ValueError):
                return None
        return StoredResponse(data["owner"], data["response"], data["input_items"], data["history"])

    def delete(self, response_id: str) -> bool:
        with self._lock:
            self._load_index()
            if self._index.pop(response_id, None) is None:
                return False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(response_id))
        return True
