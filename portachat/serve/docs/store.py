"""The document store under PORTACHAT_HOME/docs: uploaded files, vector stores (collections), their
chunks and vectors; shared by the server and `portachat docs`.

Why SQLite + faiss (measured by benchmarks/vector_stores.py on 10,000 x 384 unit vectors, top 8, one
query at a time, 2-core CPU): faiss-cpu's exact IndexFlatIP builds in 0.03 s and answers in 1.3 ms
with recall 1.00; usearch's HNSW took 12 s to build and found the true nearest neighbour for 42% of
queries (random vectors are its worst case); sqlite-vec answered in 24 ms and needs a Python whose
sqlite3 can load extensions, which some builds (this project's CI Python among them) lack. So the
vectors, texts and file rows live in one SQLite database (stdlib, transactional) and search runs
on a faiss flat index built from it on first use and rebuilt when the collection's revision
changes. One durable copy means one atomicity story: attaching a file writes all its chunks in one
transaction, so a crash or SIGKILL leaves the file either wholly in the collection or not at all.
Uploaded bytes are written atomically (storage/atomic.py) before their row is inserted.
Searches with the query's text also rank by keywords (lexical.py) and fuse the two rankings.

Files and vector stores belong to an `owner` (a stable id of the API key that made them, "" without
keys; rows from before owners existed belong to ""): the server shows each key only its own, the CLI
sees all. A quota (`max_bytes` of uploads plus chunks and vectors, `max_files`) bounds the disk; the
in-memory search indexes are an LRU bounded by `index_cache_bytes`.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from portachat.i18n import _
from portachat.serve.docs.chunking import Chunk
from portachat.serve.docs.lexical import BM25, fuse
from portachat.storage.atomic import write_bytes_atomic
from portachat.storage.paths import portachat_home

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, filename TEXT NOT NULL, bytes INTEGER NOT NULL, created_at INTEGER NOT NULL,
    purpose TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS vector_stores (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, created_at INTEGER NOT NULL, embedding_model TEXT,
    dimensions INTEGER, revision INTEGER NOT NULL DEFAULT 0, metadata TEXT NOT NULL DEFAULT '{}');
CREATE TABLE IF NOT EXISTS vector_store_files (
    vector_store_id TEXT NOT NULL, file_id TEXT NOT NULL, status TEXT NOT NULL, created_at INTEGER NOT NULL,
    chunks INTEGER NOT NULL DEFAULT 0, usage_bytes INTEGER NOT NULL DEFAULT 0, last_error TEXT,
    chunking TEXT NOT NULL DEFAULT '{}', PRIMARY KEY (vector_store_id, file_id));
CREATE TABLE IF NOT EXISTS chunks (
    id INTEGER PRIMARY KEY, vector_store_id TEXT NOT NULL, file_id TEXT NOT NULL, chunk_index INTEGER NOT NULL,
    start INTEGER NOT NULL, end INTEGER NOT NULL, text TEXT NOT NULL, vector BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS chunks_by_store ON chunks (vector_store_id, file_id);
"""
_OWNED = ("files", "vector_stores")  # tables whose rows carry an `owner` column (added to older databases)
INDEX_CACHE_BYTES = 512 * 2**20  # search indexes kept in memory (vectors + keyword postings), LRU


class StoreError(LookupError):
    """A file or vector store that does not exist, or a request the store cannot honour."""

    def __init__(self, message: str, status: int = 404, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code or ("not_found" if status == 404 else "invalid_value")


@dataclass(frozen=True)
class Hit:
    file_id: str
    filename: str
    chunk_index: int
    start: int
    end: int
    text: str
    score: float  # cosine similarity


def default_store_dir() -> Path:
    return portachat_home() / "docs"


def _now() -> int:
    return int(time.time())


class DocStore:
    """One SQLite database (`store.sqlite`) and a `files/` folder of uploaded bytes. Thread-safe (one
    connection behind a lock); several processes may share the folder (SQLite locks it)."""

    def __init__(self, root: str | Path | None = None, max_bytes: int | None = None, max_files: int | None = None,
                 index_cache_bytes: int = INDEX_CACHE_BYTES) -> None:
        self.root = Path(root) if root is not None else default_store_dir()
        self.max_bytes, self.max_files, self.index_cache_bytes = max_bytes, max_files, index_cache_bytes
        (self.root / "files").mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.root / "store.sqlite", check_same_thread=False, timeout=30,
                                   isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        self._add_owner_columns()
        self._lock = threading.RLock()
        # store id -> (revision, faiss index, chunk ids, BM25, bytes), least recently searched first
        self._indexes: OrderedDict[str, tuple] = OrderedDict()
        for tmp in (self.root / "files").glob(".tmp-*"):  # an upload a crash interrupted
            tmp.unlink(missing_ok=True)

    def _add_owner_columns(self) -> None:
        for table in _OWNED:
            columns = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
            if "owner" not in columns:
                try:
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN owner TEXT NOT NULL DEFAULT ''")
                except sqlite3.OperationalError:  # another process added it first
                    pass

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _rows(self, sql: str, args: Sequence[Any] = ()) -> list[dict]:
        with self._lock:
            cur = self._db.execute(sql, args)
            names = [d[0] for d in cur.description or []]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def _write(self, statements: list[tuple[str, Sequence[Any]]]) -> None:
        """All statements in one transaction: every one of them lands or none does."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for sql, args in statements:
                    self._db.execute(sql, args)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # ------------------------------------------------------------------ files

    # ------------------------------------------------------------------ quota

    def used_bytes(self) -> int:
        """Uploaded bytes plus every attached file's chunks and vectors: what `max_bytes` bounds."""
        rows = self._rows("SELECT (SELECT COALESCE(SUM(bytes), 0) FROM files) + "
                          "(SELECT COALESCE(SUM(usage_bytes), 0) FROM vector_store_files) AS n")
        return int(rows[0]["n"])

    def _check_room(self, more_bytes: int, more_files: int = 0) -> None:
        """StoreError (400, OpenAI's shape) when `more_bytes` / `more_files` would pass the quota."""
        if self.max_files is not None and more_files:
            n = int(self._rows("SELECT COUNT(*) AS n FROM files")[0]["n"])
            if n + more_files > self.max_files:
                raise StoreError(_("The document store holds {n} files, its limit (--docs-max-files {limit}). "
                                   "Delete files you no longer need (DELETE /v1/files/ID) and retry.").format(
                    n=n, limit=self.max_files), status=400, param="file", code="storage_quota_exceeded")
        if self.max_bytes is not None and more_bytes:
            used = self.used_bytes()
            if used + more_bytes > self.max_bytes:
                raise StoreError(_("The document store would grow to {total} bytes, past its limit (--docs-max-bytes "
                                   "{limit}). Delete files or vector stores you no longer need and retry.").format(
                    total=used + more_bytes, limit=self.max_bytes), status=400, param="file",
                    code="storage_quota_exceeded")

    # ------------------------------------------------------------------ files

    def add_file(self, filename: str, data: bytes, purpose: str = "assistants", owner: str = "") -> dict:
        file_id = f"file-{uuid.uuid4().hex[:24]}"
        with self._lock:  # the quota check and the insert together: two uploads cannot both take the last room
            self._check_room(len(data), 1)
            write_bytes_atomic(self.root / "files" / file_id, data)
            self._write([("INSERT INTO files (id, filename, bytes, created_at, purpose, owner) VALUES (?, ?, ?, ?, ?, ?)",
                          (file_id, filename, len(data), _now(), purpose, owner))])
        return self.file(file_id)

    def file(self, file_id: str) -> dict:
        rows = self._rows("SELECT * FROM files WHERE id = ?", (file_id,))
        if not rows:
            raise StoreError(_("No file with id '{id}' (GET /v1/files lists them).").format(id=file_id), param="file_id")
        return rows[0]

    def files(self, owner: str | None = None) -> list[dict]:
        """Every file, newest first; only `owner`'s when given."""
        if owner is None:
            return self._rows("SELECT * FROM files ORDER BY created_at DESC, rowid DESC")
        return self._rows("SELECT * FROM files WHERE owner = ? ORDER BY created_at DESC, rowid DESC", (owner,))

    def file_bytes(self, file_id: str) -> bytes:
        self.file(file_id)
        return (self.root / "files" / file_id).read_bytes()

    def delete_file(self, file_id: str) -> None:
        """The file, and its chunks in every vector store it was attached to."""
        self.file(file_id)
        stores = [r["vector_store_id"] for r in
                  self._rows("SELECT vector_store_id FROM vector_store_files WHERE file_id = ?", (file_id,))]
        self._write([("DELETE FROM chunks WHERE file_id = ?", (file_id,)),
                     ("DELETE FROM vector_store_files WHERE file_id = ?", (file_id,)),
                     *[("UPDATE vector_stores SET revision = revision + 1 WHERE id = ?", (s,)) for s in stores],
                     ("DELETE FROM files WHERE id = ?", (file_id,))])
        (self.root / "files" / file_id).unlink(missing_ok=True)

    # ------------------------------------------------------------------ vector stores

    def create_store(self, name: str, metadata: dict | None = None, owner: str = "") -> dict:
        store_id = f"vs_{uuid.uuid4().hex[:24]}"
        self._write([("INSERT INTO vector_stores (id, name, created_at, metadata, owner) VALUES (?, ?, ?, ?, ?)",
                      (store_id, name, _now(), json.dumps(metadata or {}), owner))])
        return self.store(store_id)

    def store(self, store_id: str) -> dict:
        rows = self._rows("SELECT * FROM vector_stores WHERE id = ?", (store_id,))
        if not rows:
            raise StoreError(_("No vector store with id '{id}' (GET /v1/vector_stores lists them).").format(id=store_id),
                             param="vector_store_id")
        return rows[0]

    def stores(self, owner: str | None = None) -> list[dict]:
        """Every vector store, newest first; only `owner`'s when given."""
        if owner is None:
            return self._rows("SELECT * FROM vector_stores ORDER BY created_at DESC, rowid DESC")
        return self._rows("SELECT * FROM vector_stores WHERE owner = ? ORDER BY created_at DESC, rowid DESC", (owner,))

    def find_store(self, name_or_id: str) -> dict | None:
        rows = self._rows("SELECT * FROM vector_stores WHERE id = ? OR name = ? ORDER BY created_at", (name_or_id,) * 2)
        return rows[0] if rows else None

    def delete_store(self, store_id: str) -> None:
        self.store(store_id)
        self._write([("DELETE FROM chunks WHERE vector_store_id = ?", (store_id,)),
                     ("DELETE FROM vector_store_files WHERE vector_store_id = ?", (store_id,)),
                     ("DELETE FROM vector_stores WHERE id = ?", (store_id,))])
        with self._lock:
            self._indexes.pop(store_id, None)

    def file_counts(self, store_id: str) -> dict[str, int]:
        counts = {"in_progress": 0, "completed": 0, "failed": 0, "cancelled": 0}
        for row in self._rows("SELECT status, COUNT(*) AS n FROM vector_store_files WHERE vector_store_id = ? "
                              "GROUP BY status", (store_id,)):
            counts[row["status"]] = row["n"]
        return {**counts, "total": sum(counts.values())}

    def usage_bytes(self, store_id: str) -> int:
        rows = self._rows("SELECT COALESCE(SUM(usage_bytes), 0) AS n FROM vector_store_files WHERE vector_store_id = ?",
                          (store_id,))
        return int(rows[0]["n"])

    # ------------------------------------------------------------------ attached files

    def store_file(self, store_id: str, file_id: str) -> dict:
        rows = self._rows("SELECT * FROM vector_store_files WHERE vector_store_id = ? AND file_id = ?",
                          (store_id, file_id))
        if not rows:
            raise StoreError(_("The file '{file}' is not in the vector store '{store}'.").format(
                file=file_id, store=store_id), param="file_id")
        return rows[0]

    def store_files(self, store_id: str) -> list[dict]:
        self.store(store_id)
        return self._rows("SELECT * FROM vector_store_files WHERE vector_store_id = ? ORDER BY created_at DESC, rowid DESC",
                          (store_id,))

    def check_model(self, store_id: str, model: str, dimensions: int | None = None) -> None:
        """A collection is searched with the model that embedded it: another model's vectors mean nothing
        here. The dimensions are checked (the name is recorded: the server and the CLI may name one model
        differently)."""
        row = self.store(store_id)
        if row["dimensions"] is not None and dimensions is not None and dimensions != row["dimensions"]:
            raise StoreError(_("The vector store '{store}' was embedded with '{used}' ({used_dims} dimensions); "
                               "'{model}' makes {dims}-dimensional vectors. Use the same embedding model, or make a "
                               "new vector store.").format(store=store_id, used=row["embedding_model"],
                                                           used_dims=row["dimensions"], model=model, dims=dimensions),
                             status=400, param="embedding_model")

    def put_chunks(self, store_id: str, file_id: str, chunks: list[Chunk], vectors: np.ndarray, model: str,
                   chunking: dict) -> dict:
        """Attach a file: its chunks and unit vectors replace any earlier ones, in one transaction."""
        self.check_model(store_id, model, int(vectors.shape[1]))
        vectors = np.ascontiguousarray(vectors, dtype="<f4")
        usage = sum(len(c.text.encode("utf-8")) for c in chunks) + vectors.nbytes
        with self._lock:  # the quota check and the write together (a re-attach frees its earlier chunks)
            earlier = self._rows("SELECT usage_bytes FROM vector_store_files WHERE vector_store_id = ? AND file_id = ?",
                                 (store_id, file_id))
            self._check_room(usage - (earlier[0]["usage_bytes"] if earlier else 0))
            self._put_chunks(store_id, file_id, chunks, vectors, model, chunking, usage)
        return self.store_file(store_id, file_id)

    def _put_chunks(self, store_id: str, file_id: str, chunks: list[Chunk], vectors: np.ndarray, model: str,
                    chunking: dict, usage: int) -> None:
        self._write([
            ("UPDATE vector_stores SET embedding_model = COALESCE(embedding_model, ?), dimensions = ?, "
             "revision = revision + 1 WHERE id = ?", (model, int(vectors.shape[1]), store_id)),
            ("DELETE FROM chunks WHERE vector_store_id = ? AND file_id = ?", (store_id, file_id)),
            *[("INSERT INTO chunks (vector_store_id, file_id, chunk_index, start, end, text, vector) "
               "VALUES (?, ?, ?, ?, ?, ?, ?)", (store_id, file_id, c.index, c.start, c.end, c.text, v.tobytes()))
              for c, v in zip(chunks, vectors, strict=True)],
            ("INSERT OR REPLACE INTO vector_store_files VALUES (?, ?, 'completed', ?, ?, ?, NULL, ?)",
             (store_id, file_id, _now(), len(chunks), usage, json.dumps(chunking))),
        ])

    def put_failed(self, store_id: str, file_id: str, code: str, message: str) -> dict:
        self._write([("INSERT OR REPLACE INTO vector_store_files VALUES (?, ?, 'failed', ?, 0, 0, ?, '{}')",
                      (store_id, file_id, _now(), json.dumps({"code": code, "message": message})))])
        return self.store_file(store_id, file_id)

    def remove_file(self, store_id: str, file_id: str) -> None:
        self.store_file(store_id, file_id)
        self._write([("DELETE FROM chunks WHERE vector_store_id = ? AND file_id = ?", (store_id, file_id)),
                     ("DELETE FROM vector_store_files WHERE vector_store_id = ? AND file_id = ?", (store_id, file_id)),
                     ("UPDATE vector_stores SET revision = revision + 1 WHERE id = ?", (store_id,))])

    # ------------------------------------------------------------------ search

    def _index(self, store_id: str) -> tuple[Any, np.ndarray, BM25 | None]:
        """The collection's faiss index, chunk ids and keyword index, rebuilt when its revision moved on."""
        import faiss  # deferred: optional package (the first search needs it)

        revision = self.store(store_id)["revision"]
        with self._lock:
            cached = self._indexes.get(store_id)
            if cached is not None and cached[0] == revision:
                self._indexes.move_to_end(store_id)
                return cached[1], cached[2], cached[3]
        with self._lock:
            rows = self._db.execute("SELECT id, vector, text FROM chunks WHERE vector_store_id = ? ORDER BY id",
                                    (store_id,)).fetchall()
        ids = np.array([r[0] for r in rows], dtype=np.int64)
        index = keywords = None
        size = ids.nbytes
        if rows:
            data = np.frombuffer(b"".join(r[1] for r in rows), dtype="<f4").reshape(len(rows), -1)
            index = faiss.IndexFlatIP(data.shape[1])  # unit vectors: inner product = cosine
            index.add(np.ascontiguousarray(data, dtype=np.float32))
            keywords = BM25([r[2] for r in rows])
            size += data.nbytes + 4 * sum(len(r[2]) for r in rows)  # vectors, and postings ~ a few bytes a char
        with self._lock:
            self._indexes.pop(store_id, None)
            if size <= self.index_cache_bytes:  # a store bigger than the whole cache is rebuilt per search
                self._indexes[store_id] = (revision, index, ids, keywords, size)
                while sum(entry[4] for entry in self._indexes.values()) > self.index_cache_bytes:
                    self._indexes.popitem(last=False)
        return index, ids, keywords

    def search(self, store_id: str, query: np.ndarray, k: int, text: str | None = None) -> list[Hit]:
        """The k chunks closest to the unit vector `query`, best first. With the query's `text`, the
        vector ranking is fused with a keyword (BM25) ranking (see lexical.py) and `score` is the fused
        score in (0, 1]; without it, `score` is the cosine similarity."""
        index, ids, keywords = self._index(store_id)
        if index is None or k < 1:
            return []
        if query.shape[-1] != index.d:
            raise StoreError(_("The query vector has {dims} dimensions; this vector store's have {store_dims}.").format(
                dims=query.shape[-1], store_dims=index.d), status=400)
        pool = min(len(ids), k if text is None else max(4 * k, 20))  # fusion looks deeper than k
        scores, rows = index.search(np.ascontiguousarray(query.reshape(1, -1), dtype=np.float32), pool)
        ranked = [(int(r), float(s)) for r, s in zip(rows[0], scores[0], strict=True) if r >= 0]
        if text is not None and keywords is not None:
            lexical = [row for row, _ in keywords.top(text, pool)]
            ranked = fuse([[r for r, _ in ranked], lexical], k)
        chosen = [(int(ids[r]), s) for r, s in ranked[:k]]
        if not chosen:
            return []
        marks = ",".join("?" * len(chosen))
        found = {r["id"]: r for r in self._rows(
            f"SELECT c.id, c.file_id, c.chunk_index, c.start, c.end, c.text, f.filename FROM chunks c "
            f"JOIN files f ON f.id = c.file_id WHERE c.id IN ({marks})", [c for c, _ in chosen])}
        return [Hit(r["file_id"], r["filename"], r["chunk_index"], r["start"], r["end"], r["text"], score)
                for cid, score in chosen if (r := found.get(cid)) is not None]
