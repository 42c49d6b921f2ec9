"""Document sources for pretraining: parquet shards, plain text, jsonl, or the synthetic curriculum.

A source is a list of *units*, each a short list of documents, read by index. Units are the grain of
data sharding: the loader's stream `s` of `n` reads the units `u` with `u % n == s`, so what a stream
sees depends only on (s, n), never on how streams are spread over processes.

- parquet: a unit is a row group (the FineWeb-Edu / ClimbMix layout: a `text` column, row groups of
  about a thousand documents).
- .txt: documents are blocks of lines separated by blank lines (a block is also cut at a line
  boundary once it reaches 64 KiB, so a file without blank lines still splits). A unit is up to 64
  consecutive documents and about 64 KiB of a file.
- .jsonl: one JSON object per line, the document is its `text` field. Units as for .txt.
- small data: when there are fewer than `MIN_UNITS` natural units they are subdivided (parquet row
  groups into row slices, text units into fewer documents each) until there are at least `MIN_UNITS`
  (or one per document), so that many streams and a train/val split still work on a small corpus.
  The rule depends only on the data, so streams stay reproducible.

`.gz` versions of .txt and .jsonl are read too (decompressed into memory once).
"""

from __future__ import annotations

import gzip
import json
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from portachat.data.document_source import DataError, DocumentSource, check_split_args, split_range
from portachat.data.synthetic.documents import SyntheticSource
from portachat.i18n import _

MIN_UNITS = 64  # fewer natural units than this in a split -> subdivide
MAX_DOCS_PER_UNIT = 64
MAX_UNIT_BYTES = 64 * 1024
MAX_TEXT_DOC_BYTES = 64 * 1024  # a .txt document without blank lines is cut at a line boundary after this
TEXT_SUFFIXES = (".txt", ".txt.gz")
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz")
PARQUET_SUFFIXES = (".parquet",)
SUPPORTED_SUFFIXES = PARQUET_SUFFIXES + TEXT_SUFFIXES + JSONL_SUFFIXES


# ----------------------------------------------------------------------------------------------
# parquet


@dataclass(frozen=True)
class _RowSlice:
    file_index: int
    row_group: int
    start: int
    stop: int


class ParquetSource(DocumentSource):
    """Parquet files with a `text` column; a unit is a row group (or a slice of one, for small data)."""

    def __init__(self, files: list[Path], metadata: list[pq.FileMetaData], name: str):
        self.files = files
        self._metadata = metadata
        self._units = _plan_row_slices(metadata)
        self.num_units = len(self._units)
        self.name = name
        self._open_file: tuple[int, pq.ParquetFile] | None = None
        self._cached_group: tuple[int, int, list] | None = None  # (file, row group, texts)
        if sum(md.num_rows for md in metadata) == 0:
            raise DataError(_("{name}: the parquet file(s) have no rows; give a shard with documents in `text`").format(
                name=name))

    @classmethod
    def _with_units(cls, base: ParquetSource, units: list[_RowSlice], name: str) -> ParquetSource:
        src = cls.__new__(cls)
        src.files, src._metadata, src._units = base.files, base._metadata, units
        src.num_units, src.name = len(units), name
        src._open_file, src._cached_group = None, None
        return src

    def _row_group_texts(self, file_index: int, row_group: int) -> list:
        # slices of one row group are read one after another by a stream: keep the last group
        if self._cached_group is not None and self._cached_group[:2] == (file_index, row_group):
            return self._cached_group[2]
        path = self.files[file_index]
        try:
            if self._open_file is None or self._open_file[0] != file_index:
                self._open_file = (file_index, pq.ParquetFile(path, metadata=self._metadata[file_index]))
            table = self._open_file[1].read_row_group(row_group, columns=["text"])
        except (OSError, pa.ArrowException) as e:
            raise DataError(
                _("{path}: cannot read row group {row_group} ({error}); the file is corrupt or truncated, "
                  "delete it and download it again").format(path=path, row_group=row_group, error=e)
            ) from e
        texts = table.column("text").to_pylist()
        self._cached_group = (file_index, row_group, texts)
        return texts

    def read_unit(self, u: int) -> list[str]:
        self._check_unit(u)
        unit = self._units[u]
        texts = self._row_group_texts(unit.file_index, unit.row_group)[unit.start : unit.stop]
        return [t for t in texts if t]  # null and empty rows carry nothing to learn


def _plan_row_slices(metadata: list[pq.FileMetaData]) -> list[_RowSlice]:
    groups = [
        (fi, rg, md.row_group(rg).num_rows)
        for fi, md in enumerate(metadata)
        for rg in range(md.num_row_groups)
        if md.row_group(rg).num_rows > 0
    ]
    if len(groups) >= MIN_UNITS:
        return [_RowSlice(fi, rg, 0, rows) for fi, rg, rows in groups]
    rows_per_unit = max(1, sum(rows for _, _, rows in groups) // MIN_UNITS)
    return [
        _RowSlice(fi, rg, start, min(start + rows_per_unit, rows))
        for fi, rg, rows in groups
        for start in range(0, rows, rows_per_unit)
    ]


def read_parquet_metadata(path: Path) -> pq.FileMetaData:
    """Open a parquet file's footer and check it has a string `text` column; DataError otherwise."""
    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as e:
        raise DataError(
            _("{path}: not a readable parquet file ({error}); it is corrupt or truncated, "
              "delete it and download it again").format(path=path, error=e)
        ) from e
    schema = pf.schema_arrow
    if "text" not in schema.names:
        raise DataError(
            _("{path}: parquet file has no `text` column (columns: {columns}); "
              "pretraining shards need one string column named `text`").format(
                path=path, columns=", ".join(schema.names))
        )
    text_type = schema.field("text").type
    if not (pa.types.is_string(text_type) or pa.types.is_large_string(text_type)):
        raise DataError(_("{path}: the `text` column has type {type}, expected strings").format(path=path, type=text_type))
    return pf.metadata


def _open_parquet(files: list[Path], split: str, val_fraction: float, label: str) -> ParquetSource:
    metadata = [read_parquet_metadata(f) for f in files]
    if len(files) >= 2:  # nanochat's layout: the last shard is val
        chosen = slice(-1, None) if split == "val" else slice(0, -1)
        return ParquetSource(files[chosen], metadata[chosen], f"{label} [{split}]")
    whole = ParquetSource(files, metadata, label)
    units = [whole._units[i] for i in split_range(whole.num_units, split, val_fraction, label)]
    return ParquetSource._with_units(whole, units, f"{label} [{split}]")


# ----------------------------------------------------------------------------------------------
# .txt and .jsonl


class _TextFile:
    """One .txt/.jsonl file: the byte span of every document, found by one scan at open time."""

    def __init__(self, path: Path):
        self.path = path
        self.is_jsonl = path.name.endswith(JSONL_SUFFIXES)
        self._data: bytes | None = None  # gz files are kept decompressed in memory
        self.starts, self.ends = array("q"), array("q")
        try:
            if path.name.endswith(".gz"):
                with gzip.open(path, "rb") as f:
                    self._data = f.read()
                lines = iter(self._data.splitlines(keepends=True))
                self._scan(lines)
            else:
                with open(path, "rb") as f:
                    self._scan(f)
        except (OSError, EOFError, gzip.BadGzipFile) as e:
            raise DataError(_("{path}: cannot read the file ({error})").format(path=path, error=e)) from e

    @property
    def num_docs(self) -> int:
        return len(self.starts)

    def _scan(self, lines: Iterator[bytes]) -> None:
        offset, doc_start, doc_end = 0, -1, -1
        for lineno, line in enumerate(lines, start=1):
            content = line.rstrip(b"\r\n")
            if self.is_jsonl:
                if content.strip() and self._jsonl_text(content, lineno):
                    self.starts.append(offset)
                    self.ends.append(offset + len(content))
            else:
                try:
                    content.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise DataError(_("{where}: not UTF-8 text ({error})").format(where=f"{self.path}:{lineno}", error=e)) from e
                if content.strip():
                    if doc_start < 0:
                        doc_start = offset
                    doc_end = offset + len(content)
                    if doc_end - doc_start >= MAX_TEXT_DOC_BYTES:
                        self.starts.append(doc_start)
                        self.ends.append(doc_end)
                        doc_start = -1
                elif doc_start >= 0:
                    self.starts.append(doc_start)
                    self.ends.append(doc_end)
                    doc_start = -1
            offset += len(line)
        if doc_start >= 0:
            self.starts.append(doc_start)
            self.ends.append(doc_end)

    def _jsonl_text(self, line: bytes, lineno: int) -> str:
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataError(_("{where}: invalid JSON ({error}); each line must be one JSON object").format(
                where=f"{self.path}:{lineno}", error=e)) from e
        if not isinstance(obj, dict) or "text" not in obj:
            raise DataError(
                _("{where}: missing the `text` field; each line must be an object like {example}").format(
                    where=f"{self.path}:{lineno}", example='{"text": "..."}')
            )
        if not isinstance(obj["text"], str):
            raise DataError(_("{where}: `text` must be a string, got {type}").format(
                where=f"{self.path}:{lineno}", type=type(obj["text"]).__name__))
        return obj["text"]

    def read_docs(self, first: int, stop: int) -> list[str]:
        lo, hi = self.starts[first], self.ends[stop - 1]
        if self._data is not None:
            blob = self._data[lo:hi]
        else:
            try:
                with open(self.path, "rb") as f:
                    f.seek(lo)
                    blob = f.read(hi - lo)
            except OSError as e:
                raise DataError(_("{path}: cannot read the file ({error})").format(path=self.path, error=e)) from e
            if len(blob) != hi - lo:
                raise DataError(_("{path}: the file changed or shrank since it was opened; open it again").format(
                    path=self.path))
        docs = []
        for i in range(first, stop):
            raw = blob[self.starts[i] - lo : self.ends[i] - lo]
            docs.append(json.loads(raw)["text"] if self.is_jsonl else raw.decode("utf-8"))
        return docs


class TextSource(DocumentSource):
    """.txt / .jsonl files; a unit is a run of consecutive documents of one file."""

    def __init__(self, files: list[_TextFile], units: list[tuple[int, int, int]], name: str):
        self._files = files
        self._units = units  # (file index, first doc, stop doc)
        self.num_units = len(units)
        self.name = name

    def read_unit(self, u: int) -> list[str]:
        self._check_unit(u)
        fi, first, stop = self._units[u]
        return self._files[fi].read_docs(first, stop)


def _plan_text_units(files: list[_TextFile]) -> list[tuple[int, int, int]]:
    total_docs = sum(f.num_docs for f in files)
    docs_per_unit = min(MAX_DOCS_PER_UNIT, max(1, total_docs // MIN_UNITS))
    units = []
    for fi, f in enumerate(files):
        first = 0
        for i in range(f.num_docs):
            if i + 1 - first >= docs_per_unit or f.ends[i] - f.starts[first] >= MAX_UNIT_BYTES:
                units.append((fi, first, i + 1))
                first = i + 1
        if first < f.num_docs:
            units.append((fi, first, f.num_docs))
    return units


def _open_text(paths: list[Path], split: str, val_fraction: float, label: str) -> TextSource:
    files = [_TextFile(p) for p in paths]
    if sum(f.num_docs for f in files) == 0:
        raise DataError(_("{label}: no non-empty documents found; the file(s) are empty or blank").format(label=label))
    units = _plan_text_units(files)
    chosen = [units[i] for i in split_range(len(units), split, val_fraction, label)]
    return TextSource(files, chosen, f"{label} [{split}]")


# ----------------------------------------------------------------------------------------------
# entry point


def _is_hidden(path: Path, root: Path) -> bool:
    # skips .cache/ (huggingface_hub's partial downloads live there) and dotfiles
    return any(part.startswith(".") for part in path.relative_to(root).parts)


def find_data_files(root: Path) -> list[Path]:
    """Supported data files under a directory, recursive, sorted by path."""
    return sorted(
        p
        for p in root.rglob("*")
        if p.is_file() and p.name.endswith(SUPPORTED_SUFFIXES) and not _is_hidden(p, root)
    )


def open_source(
    spec: str | Path | None, split: str = "train", val_fraction: float = 0.05
) -> DocumentSource:
    """Open pretraining documents.

    `spec` is a file (.parquet, .txt, .jsonl, optionally .gz for the text kinds), a directory of them
    (recursive, sorted), or None / "synthetic" for the built-in curriculum. For two or more parquet
    files the last file is the val split; otherwise the last `val_fraction` of units (at least one).
    Everything is checked now, so bad data fails before training starts.
    """
    check_split_args(split, val_fraction)
    if spec is None or str(spec) == "synthetic":
        return SyntheticSource(split=split, val_fraction=val_fraction)
    path = Path(spec).expanduser()
    if not path.exists():
        raise DataError(
            _("{path}: no such file or directory; give a parquet/txt/jsonl file or a directory of them, "
              "or 'synthetic' for the built-in curriculum").format(path=path)
        )
    if path.is_dir():
        files = find_data_files(path)
        if not files:
            raise DataError(
                _("{path}: no data files found (looked for {suffixes}, recursively); "
                  "put shards there or download them with portachat.data.hub.download_shards").format(
                    path=path, suffixes=", ".join(SUPPORTED_SUFFIXES))
            )
    elif path.name.endswith(SUPPORTED_SUFFIXES):
        files = [path]
    else:
        raise DataError(_("{path}: unsupported file type; supported: {suffixes}").format(
            path=path, suffixes=", ".join(SUPPORTED_SUFFIXES)))
    parquet = [f for f in files if f.name.endswith(PARQUET_SUFFIXES)]
    if parquet and len(parquet) != len(files):
        raise DataError(
            _("{path}: mixes parquet with .txt/.jsonl files; put each kind in its own directory and "
              "pass one of them").format(path=path)
        )
    label = str(path)
    if parquet:
        return _open_parquet(files, split, val_fraction, label)
    return _open_text(files, split, val_fraction, label)
