"""Shared helpers for the data tests: a byte-level fake tokenizer and small data writers."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


class ByteTokenizer:
    """Token ids are UTF-8 bytes; BOS is 256 (never a byte), so rows split cleanly at BOS."""

    bos_id = 256

    def __init__(self):
        self.calls = 0

    def encode_batch(self, texts: list[str], prepend_bos: bool) -> list[list[int]]:
        self.calls += 1
        return [([self.bos_id] if prepend_bos else []) + list(t.encode("utf-8")) for t in texts]


def write_parquet(path: Path, texts: list, row_group_size: int, **extra_columns) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"text": texts, **extra_columns}), path, row_group_size=row_group_size)
    return path


def write_jsonl(path: Path, texts: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(texts)))
    return path


def numbered_docs(n: int, prefix: str = "doc") -> list[str]:
    # varied lengths, so best-fit packing has choices to make
    return [f"{prefix} {i}: " + "word " * (1 + (i * 7) % 23) for i in range(n)]
