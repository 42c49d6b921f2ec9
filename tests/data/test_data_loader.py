from __future__ import annotations

import collections
import itertools
import json
import random

import pytest
import torch
from data_helpers import SHARED_DATA, ByteTokenizer, write_parquet

from portachat.data.document_source import DataError, DocumentSource
from portachat.data.loader import PackedLoader, iter_val_batches
from portachat.data.sources import open_source
from portachat.data.synthetic.documents import SyntheticSource

BOS = ByteTokenizer.bos_id


class ListSource(DocumentSource):
    """Units given as lists of documents."""

    def __init__(self, units: list[list[str]], name: str = "list"):
        self.units, self.num_units, self.name = units, len(units), name

    def read_unit(self, u: int) -> list[str]:
        self._check_unit(u)
        return list(self.units[u])


def random_source(num_units: int, docs_per_unit: int, seed: int = 0, max_len: int = 90) -> ListSource:
    rng = random.Random(seed)
    return ListSource([
        ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(0, max_len))) or "z"
         for _ in range(docs_per_unit)]
        for _ in range(num_units)
    ])


def reference_rows(source, stream, num_streams, seq_len, n_rows, buffer_docs, batch_docs):
    """nanochat's best-fit packing written the plain way: scan the buffer in order; the rest of a
    cropped document goes to the end of the buffer behind a fresh BOS."""
    tok = ByteTokenizer()
    docs = (d for _ in itertools.count() for u in range(stream, source.num_units, num_streams)
            for d in source.read_unit(u))
    buf: list[list[int]] = []
    rows = []
    for _ in range(n_rows):
        row: list[int] = []
        while len(row) < seq_len + 1:
            while len(buf) < buffer_docs:
                buf.extend(tok.encode_batch([next(docs) for _ in range(batch_docs)], prepend_bos=True))
            space = seq_len + 1 - len(row)
            best, best_len = -1, 0
            for i, d in enumerate(buf):
                if best_len < len(d) <= space:
                    best, best_len = i, len(d)
            if best >= 0:
                row.extend(buf.pop(best))
            else:
                shortest = buf.pop(min(range(len(buf)), key=lambda i: len(buf[i])))
                row.extend(shortest[:space])
                buf.append(shortest[:1] + shortest[space:])
        rows.append(row)
    return rows


def loader_rows(loader: PackedLoader, n_batches: int) -> list[list[int]]:
    rows = []
    for _ in range(n_batches):
        x, y = loader.next_batch()
        assert torch.equal(x[:, 1:], y[:, :-1])
        rows.extend(torch.cat([x, y[:, -1:]], dim=1).tolist())
    return rows


@pytest.mark.parametrize(("buffer_docs", "batch_docs", "seq_len"), [(1000, 128, 64), (7, 3, 40), (50, 16, 256)])
def test_matches_reference_best_fit(buffer_docs, batch_docs, seq_len):
    src = random_source(12, 30, seed=seq_len)
    loader = PackedLoader(src, ByteTokenizer(), batch_size=4, seq_len=seq_len, stream=1, num_streams=3,
                          tokenizer_batch_docs=batch_docs, buffer_docs=buffer_docs)
    got = loader_rows(loader, 25)
    assert got == reference_rows(src, 1, 3, seq_len, 100, buffer_docs, batch_docs)


def test_hand_checked_rows():
    # with BOS: "aaaa" is 5 tokens, "bb" 3, "c" 2; rows hold 8
    src = ListSource([["aaaa", "bb", "c"]])
    loader = PackedLoader(src, ByteTokenizer(), batch_size=4, seq_len=7, tokenizer_batch_docs=3, buffer_docs=3)
    x, y = loader.next_batch()
    rows = torch.cat([x, y[:, -1:]], dim=1).tolist()
    a, b, c = ord("a"), ord("b"), ord("c")
    assert rows[0] == [BOS, a, a, a, a, BOS, b, b]  # largest fitting, then the 3 that is left
    assert rows[1] == [BOS, a, a, a, a, BOS, b, b]
    assert rows[2] == [BOS, a, a, a, a, BOS, b, b]
    assert rows[3] == [BOS, c, BOS, a, a, a, a, BOS]  # nothing fits the last slot: "c" is cropped to its BOS


def test_hand_checked_fragments():
    # one 10-letter document (11 tokens with BOS), rows of 8: crops go on as fragments behind a fresh BOS
    src = ListSource([["abcdefghij"]])
    loader = PackedLoader(src, ByteTokenizer(), batch_size=4, seq_len=7, tokenizer_batch_docs=1, buffer_docs=1)
    rows = loader_rows(loader, 1)
    a, b, c, d, e, f, g, h, i, j = (ord(ch) for ch in "abcdefghij")
    assert rows == [
        [BOS, a, b, c, d, e, f, g],  # cropped: [BOS, h, i, j] goes back into the buffer
        [BOS, h, i, j, BOS, a, b, c],  # the fragment fits; then the next epoch's copy is cropped
        [BOS, d, e, f, g, h, i, j],  # its rest is exactly 8 tokens
        [BOS, a, b, c, d, e, f, g],
    ]
    # the first 3 rows hold 2 epochs of the document: every letter is a target exactly twice
    targets = [t for row in rows[:3] for t in row[1:] if t != BOS]
    assert sorted(targets) == sorted(list(b"abcdefghij") * 2)


def test_rows_are_bos_aligned_documents_without_padding():
    path = SHARED_DATA / "tinyshakespeare.txt"
    if not path.is_file():
        pytest.skip("reference data missing")
    src = open_source(path)
    docs = {d.encode() for d in src.iter_documents()}
    loader = PackedLoader(src, ByteTokenizer(), batch_size=8, seq_len=128)
    x, y = loader.next_batch()
    assert x.dtype == torch.int64 and x.shape == (8, 128) and y.shape == (8, 128)
    assert loader.tokens_per_batch == 8 * 128
    for row in loader_rows(loader, 10):
        assert row[0] == BOS
        pieces = bytes(t if t != BOS else 0 for t in row).split(b"\x00")[1:]
        # every piece is a whole document or a contiguous part of one (a crop, or the rest of a crop)
        assert all(p in docs or any(p in d for d in docs) for p in pieces)


def test_exact_resume_through_json():
    src = SyntheticSource(num_units=40, docs_per_unit=16)
    make = lambda: PackedLoader(src, ByteTokenizer(), batch_size=3, seq_len=96, stream=2,  # noqa: E731
                                num_streams=4, tokenizer_batch_docs=32, buffer_docs=100)
    reference = make()
    expected = loader_rows(reference, 60)  # several epochs of this stream's 10 units
    assert reference.epoch >= 1
    for stop in (0, 1, 7, 33):
        first = make()
        loader_rows(first, stop)
        state = json.loads(json.dumps(first.state_dict()))
        assert all(isinstance(v, (int, list)) for v in state.values())
        resumed = make()
        resumed.load_state_dict(state)
        assert loader_rows(resumed, 60 - stop) == expected[3 * stop:]
        assert resumed.batches == 60


def test_resume_with_other_batch_size_continues_the_same_rows():
    src = random_source(4, 40)
    a = PackedLoader(src, ByteTokenizer(), batch_size=4, seq_len=50)
    expected = loader_rows(a, 10)
    b = PackedLoader(src, ByteTokenizer(), batch_size=4, seq_len=50)
    loader_rows(b, 3)
    c = PackedLoader(src, ByteTokenizer(), batch_size=2, seq_len=50)
    c.load_state_dict(b.state_dict())
    assert loader_rows(c, 14) == expected[12:]


def test_state_is_small():
    loader = PackedLoader(SyntheticSource(), ByteTokenizer(), batch_size=4, seq_len=256)
    loader.next_batch()
    assert len(json.dumps(loader.state_dict())) < 30_000  # references, not tokens


def test_streams_make_distributed_runs_reproducible():
    """2 ranks x 1 micro-step and 1 rank x 2 micro-steps see the same rows at every step."""
    src = random_source(10, 20, seed=3)
    tok = ByteTokenizer()

    def step_rows(world_size: int, accum: int, steps: int) -> list[list[list[int]]]:
        loaders = {(r, m): PackedLoader(src, tok, 2, 32, stream=r * accum + m, num_streams=world_size * accum)
                   for r in range(world_size) for m in range(accum)}
        out = []
        for _ in range(steps):
            rows = []
            for r in range(world_size):
                for m in range(accum):
                    rows.extend(loader_rows(loaders[r, m], 1))
            out.append(sorted(rows))
        return out

    assert step_rows(2, 1, 6) == step_rows(1, 2, 6)
    # streams partition the units: each unit belongs to exactly one stream
    owners = [[u for u in range(src.num_units) if u % 2 == s] for s in range(2)]
    assert sorted(owners[0] + owners[1]) == list(range(src.num_units))
    # and stream 1's rows do not depend on stream 0 having run first
    alone = PackedLoader(src, tok, 2, 32, stream=1, num_streams=2)
    assert loader_rows(alone, 3) == loader_rows(PackedLoader(src, tok, 2, 32, stream=1, num_streams=2), 3)


def test_stream_reads_only_its_units():
    src = ListSource([[f"unit{u}-doc{i}" for i in range(5)] for u in range(6)])
    loader = PackedLoader(src, ByteTokenizer(), batch_size=2, seq_len=30, stream=1, num_streams=3)
    text = bytes(t for row in loader_rows(loader, 5) for t in row if t != BOS).decode()
    assert "unit1-" in text and "unit4-" in text
    assert not any(f"unit{u}-" in text for u in (0, 2, 3, 5))


def test_too_few_units_for_streams():
    with pytest.raises(DataError, match="3 data units are too few for 4 streams"):
        PackedLoader(ListSource([["a"], ["b"], ["c"]]), ByteTokenizer(), 1, 8, stream=0, num_streams=4)


def test_bad_arguments():
    src = ListSource([["a"]])
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        PackedLoader(src, ByteTokenizer(), 0, 8)
    with pytest.raises(ValueError, match="stream must be in"):
        PackedLoader(src, ByteTokenizer(), 1, 8, stream=1, num_streams=1)


def test_state_mismatch_is_a_clear_error():
    src = random_source(4, 10)
    state = PackedLoader(src, ByteTokenizer(), 2, 32, stream=0, num_streams=2).state_dict()
    with pytest.raises(DataError, match="stream: saved 0, now 1"):
        PackedLoader(src, ByteTokenizer(), 2, 32, stream=1, num_streams=2).load_state_dict(state)
    with pytest.raises(DataError, match="seq_len: saved 32, now 64"):
        PackedLoader(src, ByteTokenizer(), 2, 64, stream=0, num_streams=2).load_state_dict(state)
    with pytest.raises(DataError, match="num_streams: saved 2, now 4"):
        PackedLoader(src, ByteTokenizer(), 2, 32, stream=0, num_streams=4).load_state_dict(state)
    with pytest.raises(DataError, match="not a data loader state"):
        PackedLoader(src, ByteTokenizer(), 2, 32).load_state_dict({"epoch": 1})


def test_old_state_version_is_a_clear_error():
    src = random_source(4, 10)
    state = PackedLoader(src, ByteTokenizer(), 2, 32).state_dict()
    old = {**state, "version": 1, "buffer": [ref[:2] for ref in state["buffer"]]}
    with pytest.raises(DataError, match="state has version 1, this portachat reads version 2.*start the run again"):
        PackedLoader(src, ByteTokenizer(), 2, 32).load_state_dict(old)


def test_bad_fragment_offset_in_state():
    src = ListSource([["abcdefghij"]])
    loader = PackedLoader(src, ByteTokenizer(), 1, 7, tokenizer_batch_docs=1, buffer_docs=1)
    loader.next_batch()
    state = loader.state_dict()
    assert state["buffer"] == [[0, 0, 7]]
    for offset in (10, -1):
        with pytest.raises(DataError, match=f"token offset {offset} of document 0 of unit 0, which has 10 tokens"):
            PackedLoader(src, ByteTokenizer(), 1, 7, tokenizer_batch_docs=1, buffer_docs=1).load_state_dict(
                {**state, "buffer": [[0, 0, offset]]})


def test_data_with_only_empty_documents(tmp_path):
    path = write_parquet(tmp_path / "e.parquet", ["", None, ""] * 30, row_group_size=10)
    loader = PackedLoader(open_source(path), ByteTokenizer(), 1, 8)
    with pytest.raises(DataError, match="no non-empty documents"):
        loader.next_batch()


# ------------------------------------------------------------------------------------------- val


def test_val_batches_are_one_deterministic_pass():
    src = random_source(6, 20, seed=5)
    total_tokens = sum(len(d) + 1 for u in range(6) for d in src.read_unit(u))
    batches = list(iter_val_batches(src, ByteTokenizer(), batch_size=4, seq_len=63))
    rows = sum(x.shape[0] for x, _ in batches)
    assert all(x.shape[0] == 4 for x, _ in batches[:-1]) and 1 <= batches[-1][0].shape[0] <= 4
    # one pass: about as many tokens as the data has (crops drop a little), never a second epoch
    assert 0.8 * total_tokens <= rows * 64 <= total_tokens
    again = list(iter_val_batches(src, ByteTokenizer(), batch_size=4, seq_len=63))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, again, strict=True))
    assert len(list(iter_val_batches(src, ByteTokenizer(), 4, 63, max_batches=2))) == 2


def test_val_with_fewer_units_than_streams_shards_rows():
    src = random_source(2, 30, seed=9)
    whole = torch.cat([x for x, _ in iter_val_batches(src, ByteTokenizer(), 1, 31)])
    parts = [torch.cat([x for x, _ in iter_val_batches(src, ByteTokenizer(), 1, 31, stream=s, num_streams=3)])
             for s in range(3)]
    assert torch.equal(parts[1], whole[1::3]) and sum(p.shape[0] for p in parts) == whole.shape[0]


def test_val_too_small_for_one_row():
    with pytest.raises(DataError, match="fewer than seq_len \\+ 1 = 1025 tokens"):
        list(iter_val_batches(ListSource([["tiny"], ["data"]]), ByteTokenizer(), 2, 1024))


def test_val_stream_without_rows_yields_nothing_when_there_are_several_streams():
    # raising on one rank only would hang the others in the all-reduce of the byte counts
    src = ListSource([["tiny"], ["x" * 200]])  # stream 0's unit is too small for a row, stream 1's is not
    assert list(iter_val_batches(src, ByteTokenizer(), 2, 63, stream=0, num_streams=2)) == []
    # 200 content tokens: 3 rows of 63 (crops continue as fragments), the 11 left make no full row
    assert [x.shape[0] for x, _ in iter_val_batches(src, ByteTokenizer(), 2, 63, stream=1, num_streams=2)] == [2, 1]
    # row-sharded (fewer units than streams): one row in all, so streams 1 and 2 get none
    one_row = ListSource([["y" * 70]])
    got = [list(iter_val_batches(one_row, ByteTokenizer(), 2, 63, stream=s, num_streams=3)) for s in range(3)]
    assert [len(g) for g in got] == [1, 0, 0]
    # no stream has data: none raises, the caller finds the all-reduced total empty on every rank at once
    tiny = ListSource([["tiny"], ["data"]])
    assert all(list(iter_val_batches(tiny, ByteTokenizer(), 2, 1024, stream=s, num_streams=2)) == []
               for s in range(2))


# --------------------------------------------------------------------------- with the real tokenizer


def test_with_trained_tokenizer(request):
    tokenizer_module = pytest.importorskip("portachat.tokenizer")
    if not hasattr(tokenizer_module, "train_tokenizer"):
        pytest.skip("portachat.tokenizer.train_tokenizer not there yet")
    tokenizer = request.getfixturevalue("small_tokenizer")
    src = open_source(SHARED_DATA / "tinyshakespeare.txt")
    make = lambda: PackedLoader(src, tokenizer, batch_size=4, seq_len=64, stream=1, num_streams=2)  # noqa: E731
    a = make()
    expected = [a.next_batch() for _ in range(6)]
    for x, _ in expected:
        assert (x[:, 0] == tokenizer.bos_id).all()
    b = make()
    for _ in range(2):
        b.next_batch()
    c = make()
    c.load_state_dict(json.loads(json.dumps(b.state_dict())))
    for want in expected[2:]:
        got = c.next_batch()
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# ------------------------------------------------------------------------- long documents, fragments


class PositionTokenizer:
    """Document "k:n" is BOS then n tokens k * 10_000 + position: every token says where it came from."""

    bos_id = 1 << 30

    def encode_batch(self, texts: list[str], prepend_bos: bool) -> list[list[int]]:
        out = []
        for text in texts:
            k, n = (int(v) for v in text.split(":"))
            out.append(([self.bos_id] if prepend_bos else []) + [k * 10_000 + p for p in range(n)])
        return out


def position_source(num_units: int, docs_per_unit: int, max_len: int, seed: int = 0) -> ListSource:
    rng = random.Random(seed)
    return ListSource([[f"{u * docs_per_unit + d}:{rng.randint(1, max_len)}" for d in range(docs_per_unit)]
                       for u in range(num_units)])


def test_every_token_is_a_target_exactly_once():
    """Exact conservation, checked against the saved state at many points over several epochs: for
    every content token, (times it was a target) + (times it waits in a buffered fragment) equals the
    times its document was read. So over an epoch each token is trained on once: none lost, none twice."""
    src = position_source(6, 10, max_len=120, seed=1)  # documents up to ~4 rows long
    stream, num_streams, seq_len = 1, 2, 32
    loader = PackedLoader(src, PositionTokenizer(), batch_size=2, seq_len=seq_len, stream=stream,
                          num_streams=num_streams, tokenizer_batch_docs=4, buffer_docs=8)
    units = list(range(stream, src.num_units, num_streams))
    targets: collections.Counter = collections.Counter()
    saw_fragment = False
    for _ in range(16):
        for _ in range(5):
            x, y = loader.next_batch()
            assert (x[:, 0] == PositionTokenizer.bos_id).all()
            targets.update(t for t in y.flatten().tolist() if t != PositionTokenizer.bos_id)
        state = json.loads(json.dumps(loader.state_dict()))
        pending: collections.Counter = collections.Counter()
        for unit, index, offset in state["buffer"]:
            k, n = (int(v) for v in src.units[unit][index].split(":"))
            pending.update(k * 10_000 + p for p in range(offset, n))
            saw_fragment |= offset > 0
        for pos, unit in enumerate(units):
            for index, text in enumerate(src.units[unit]):
                reads = state["epoch"] + ((pos, index) < (state["unit_pos"], state["doc_offset"]))
                k, n = (int(v) for v in text.split(":"))
                for p in range(n):
                    token = k * 10_000 + p
                    assert targets[token] + pending[token] == reads, (unit, index, p)
    assert state["epoch"] >= 3 and saw_fragment


def test_exact_resume_mid_fragment_through_json():
    src = random_source(8, 12, seed=4, max_len=300)  # most documents are longer than a row
    make = lambda: PackedLoader(src, ByteTokenizer(), batch_size=2, seq_len=40, stream=0,  # noqa: E731
                                num_streams=2, tokenizer_batch_docs=5, buffer_docs=10)
    expected = loader_rows(make(), 80)
    assert all(row[0] == BOS for row in expected)
    resumed_mid_fragment = 0
    for stop in (1, 2, 3, 5, 8, 13, 21, 34, 55):
        first = make()
        loader_rows(first, stop)
        state = json.loads(json.dumps(first.state_dict()))
        resumed_mid_fragment += any(offset > 0 for _, _, offset in state["buffer"])
        resumed = make()
        resumed.load_state_dict(state)
        assert loader_rows(resumed, 80 - stop) == expected[2 * stop:]
    assert resumed_mid_fragment >= 5


def test_long_documents_are_trained_on_in_full(tmp_path):
    """The review's measurement: a .txt file without blank lines is cut into 64 KiB documents; with
    T=256 cropping without fragments used ~0.5% of the tokens per epoch. Now nearly all are used."""
    rng = random.Random(0)
    words = ["thou", "art", "the", "king", "of", "my", "heart", "and", "yet", "I", "will", "not", "go"]
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(9000)]
    path = tmp_path / "no_blank_lines.txt"
    path.write_text("\n".join(lines) + "\n")
    src = open_source(path)
    docs = list(src.iter_documents())
    total = sum(len(d.encode()) for d in docs)
    seq_len = 256
    assert max(len(d.encode()) for d in docs) > 60_000
    assert len(docs) * seq_len / total < 0.01  # what the old crop-and-drop could use at most
    used = sum(int((y != BOS).sum()) for _, y in iter_val_batches(src, ByteTokenizer(), 8, seq_len))
    assert total - seq_len <= used <= total  # only the last, incomplete row is left out
