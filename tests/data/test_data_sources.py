from __future__ import annotations

import gzip
import json

import pytest
from data_helpers import SHARED_DATA, numbered_docs, write_jsonl, write_parquet

from portachat.data import sources
from portachat.data.document_source import DataError
from portachat.data.sources import open_source


def all_docs(src) -> list[str]:
    return [d for u in range(src.num_units) for d in src.read_unit(u)]


# ---------------------------------------------------------------------------------------------- txt


def test_txt_documents_are_blank_line_blocks(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("First:\nline one\nline two\n\n\nSecond:\nhi\n\nThird\n")
    train = open_source(path, "train", val_fraction=0.3)
    val = open_source(path, "val", val_fraction=0.3)
    # three documents -> three units (small data is subdivided), last one is val
    assert all_docs(train) == ["First:\nline one\nline two", "Second:\nhi"]
    assert all_docs(val) == ["Third"]


def test_tinyshakespeare_units_and_split():
    path = SHARED_DATA / "tinyshakespeare.txt"
    if not path.is_file():
        pytest.skip("reference data missing")
    train, val = open_source(path, "train"), open_source(path, "val")
    docs = all_docs(train) + all_docs(val)
    # speaker turns, in order, covering every non-blank line exactly once
    assert docs[0] == "First Citizen:\nBefore we proceed any further, hear me speak."
    text = path.read_text()
    assert sum(len(d.splitlines()) for d in docs) == sum(1 for line in text.splitlines() if line.strip())
    assert val.num_units == round(0.05 * (train.num_units + val.num_units))
    assert all(1 <= len(train.read_unit(u)) <= sources.MAX_DOCS_PER_UNIT for u in range(train.num_units))
    assert train.read_unit(3) == train.read_unit(3)  # deterministic re-reads
    assert not set(all_docs(val)[-5:]) & set(all_docs(train)[-5:])


def test_txt_without_blank_lines_is_cut_into_documents(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "MAX_TEXT_DOC_BYTES", 100)
    path = tmp_path / "long.txt"
    lines = [f"line {i:04d} of a file with no blank lines" for i in range(100)]
    path.write_text("\n".join(lines))
    docs = all_docs(open_source(path, "train")) + all_docs(open_source(path, "val"))
    assert len(docs) > 10
    assert "\n".join(docs) == "\n".join(lines)


def test_txt_gz_and_directory_recursive_sorted(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "a.txt").write_text("alpha\n\nbeta\n")
    with gzip.open(tmp_path / "b" / "c.txt.gz", "wt") as f:
        f.write("gamma\n\ndelta\n\nepsilon\n")
    (tmp_path / "notes.md").write_text("ignored")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "x.txt").write_text("hidden")
    docs = all_docs(open_source(tmp_path, "train", 0.2)) + all_docs(open_source(tmp_path, "val", 0.2))
    assert docs == ["alpha", "beta", "gamma", "delta", "epsilon"]


def test_iter_documents_limit_chars(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("\n\n".join(numbered_docs(50)))
    src = open_source(path)
    full = list(src.iter_documents())
    assert full == all_docs(src)
    limited = list(src.iter_documents(limit_chars=100))
    assert sum(map(len, limited)) == 100
    assert limited[:-1] == full[: len(limited) - 1] and full[len(limited) - 1].startswith(limited[-1])


def test_unit_boundaries_respect_size_limits(tmp_path):
    path = tmp_path / "big.txt"
    docs = numbered_docs(5000)
    path.write_text("\n\n".join(docs))
    src = open_source(path, "train", val_fraction=0.01)
    sizes = [len(src.read_unit(u)) for u in range(src.num_units)]
    assert max(sizes) == sources.MAX_DOCS_PER_UNIT  # plenty of data: natural units of 64 docs
    assert all_docs(src) == docs[: sum(sizes)]


# -------------------------------------------------------------------------------------------- jsonl


def test_jsonl_text_field_and_empty_skipped(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ["one", "", "two", "three"])
    with open(path, "a") as f:
        f.write("\n")  # a trailing blank line is fine
    docs = all_docs(open_source(path, "train", 0.3)) + all_docs(open_source(path, "val", 0.3))
    assert docs == ["one", "two", "three"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"text": "ok"}\n{"txt": "x"}\n', r"d\.jsonl:2: missing the `text` field"),
        ('{"text": "ok"}\n{"text": oops}\n', r"d\.jsonl:2: invalid JSON"),
        ('{"text": 5}\n', r"d\.jsonl:1: `text` must be a string"),
        ('["text"]\n', r"d\.jsonl:1: missing the `text` field"),
    ],
)
def test_jsonl_errors_name_the_line(tmp_path, line, message):
    path = tmp_path / "d.jsonl"
    path.write_text(line)
    with pytest.raises(DataError, match=message):
        open_source(path)


def test_jsonl_gz_gsm8k_style(tmp_path):
    path = tmp_path / "x.jsonl.gz"
    with gzip.open(path, "wt") as f:
        for i in range(10):
            f.write(json.dumps({"text": f"t{i}"}) + "\n")
    assert all_docs(open_source(path, "train")) == [f"t{i}" for i in range(9)]


# ------------------------------------------------------------------------------------------ parquet


def test_parquet_row_groups_are_units(tmp_path):
    texts = numbered_docs(700)
    path = write_parquet(tmp_path / "one.parquet", texts, row_group_size=10)  # 70 row groups >= MIN_UNITS
    train, val = open_source(path, "train"), open_source(path, "val")
    assert train.num_units + val.num_units == 70
    assert val.num_units == 4  # round(0.05 * 70)
    assert train.read_unit(0) == texts[:10] and train.read_unit(5) == texts[50:60]
    assert all_docs(train) + all_docs(val) == texts


def test_small_parquet_row_group_is_subdivided(tmp_path):
    texts = numbered_docs(200)
    path = write_parquet(tmp_path / "one.parquet", texts, row_group_size=1000)  # a single row group
    train, val = open_source(path, "train"), open_source(path, "val")
    assert train.num_units + val.num_units >= sources.MIN_UNITS
    assert all_docs(train) + all_docs(val) == texts


def test_parquet_last_file_is_val_and_nulls_dropped(tmp_path):
    write_parquet(tmp_path / "shard_00000.parquet", ["a0", None, "a1", ""], row_group_size=2)
    write_parquet(tmp_path / "shard_00001.parquet", ["b0", "b1"], row_group_size=2)
    write_parquet(tmp_path / "shard_00002.parquet", ["v0", "v1", "v2"], row_group_size=2)
    train, val = open_source(tmp_path, "train"), open_source(tmp_path, "val")
    assert all_docs(train) == ["a0", "a1", "b0", "b1"]
    assert all_docs(val) == ["v0", "v1", "v2"]


def test_parquet_without_text_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"content": ["x"]}), tmp_path / "bad.parquet")
    with pytest.raises(DataError, match=r"bad\.parquet: parquet file has no `text` column \(columns: content\)"):
        open_source(tmp_path / "bad.parquet")


def test_parquet_text_column_of_wrong_type(tmp_path):
    write_parquet(tmp_path / "ints.parquet", [1, 2, 3], row_group_size=2)
    with pytest.raises(DataError, match="`text` column has type int64"):
        open_source(tmp_path / "ints.parquet")


def test_corrupt_parquet_names_the_file(tmp_path):
    write_parquet(tmp_path / "good.parquet", numbered_docs(10), row_group_size=5)
    (tmp_path / "zbroken.parquet").write_bytes(b"PAR1 definitely not parquet")
    with pytest.raises(DataError, match=r"zbroken\.parquet: not a readable parquet file.*delete it"):
        open_source(tmp_path)


def test_truncated_parquet_body_fails_on_read(tmp_path):
    path = write_parquet(tmp_path / "t.parquet", numbered_docs(300), row_group_size=100)
    src = open_source(path, "train")
    data = bytearray(path.read_bytes())
    data[10:2000] = b"\x00" * 1990  # the footer survives, the first row group does not
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"t\.parquet: cannot read row group 0"):
        src.read_unit(0)


def test_empty_parquet(tmp_path):
    import pyarrow as pa

    write_parquet(tmp_path / "e.parquet", pa.array([], pa.string()), row_group_size=10)
    with pytest.raises(DataError, match="no rows"):
        open_source(tmp_path / "e.parquet")


# ------------------------------------------------------------------------------------- bad inputs


def test_missing_path(tmp_path):
    with pytest.raises(DataError, match="no such file or directory.*'synthetic'"):
        open_source(tmp_path / "nope")


def test_directory_without_data(tmp_path):
    (tmp_path / "README.md").write_text("hi")
    with pytest.raises(DataError, match=r"no data files found \(looked for \.parquet"):
        open_source(tmp_path)


@pytest.mark.parametrize("content", ["", "\n\n  \n\n"])
def test_empty_text_file(tmp_path, content):
    (tmp_path / "e.txt").write_text(content)
    with pytest.raises(DataError, match="no non-empty documents"):
        open_source(tmp_path / "e.txt")


def test_single_document_cannot_split(tmp_path):
    (tmp_path / "one.txt").write_text("just one document\n")
    with pytest.raises(DataError, match="too little to split into train and val"):
        open_source(tmp_path / "one.txt")


def test_unsupported_and_mixed(tmp_path):
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(DataError, match="unsupported file type"):
        open_source(tmp_path / "x.csv")
    write_parquet(tmp_path / "mix" / "a.parquet", ["a", "b"], row_group_size=1)
    (tmp_path / "mix" / "b.txt").write_text("c\n\nd\n")
    with pytest.raises(DataError, match="mixes parquet with"):
        open_source(tmp_path / "mix")


def test_non_utf8_text(tmp_path):
    (tmp_path / "bin.txt").write_bytes(b"fine\n\xff\xfe broken\n")
    with pytest.raises(DataError, match=r"bin\.txt:2: not UTF-8"):
        open_source(tmp_path / "bin.txt")


def test_bad_split_arguments(tmp_path):
    with pytest.raises(DataError, match="split must be"):
        open_source(None, split="test")
    with pytest.raises(DataError, match="val_fraction"):
        open_source(None, val_fraction=1.5)


def test_synthetic_spec():
    for spec in (None, "synthetic"):
        train, val = open_source(spec), open_source(spec, "val")
        assert train.num_units == 1900 and val.num_units == 100
        assert train.read_unit(0) != val.read_unit(0)
