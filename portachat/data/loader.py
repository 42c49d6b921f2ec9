"""Tokenizing packing loader: BOS-aligned rows, sharded by stream, with an exact resume position.

Packing is nanochat's best-fit: every document is tokenized with a leading BOS; a row of T+1 tokens
is filled by repeatedly taking, from a buffer of tokenized documents, the largest one that still
fits; when none fits, the shortest is cropped to fill the row exactly. So there is no padding and
every row starts with BOS. The rest of a cropped document is not dropped: it goes back into the
buffer as a *fragment* that starts with a fresh BOS and competes for rows like any document, so a
long document (a 64 KiB block of a .txt file) is trained on in full, not just its first T tokens.

Sharding is by *stream*: stream `s` of `n` reads the source's units `u % n == s`, in order, epoch
after epoch. The training loop makes one stream per (rank, micro-step), `s = rank * accum + micro`,
so the rows of a step depend only on world_size * grad_accum, not on how they are split.

Exact resume: the position is the (epoch, unit, document) cursor plus the buffer. The buffer holds
documents and fragments of them, saved as (unit, document index, token offset) references, a few
KB of JSON, and re-tokenized on load; the tokenizer is deterministic, so the rows that follow are
the same as if the run had never stopped.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Protocol

import torch

from portachat.data.document_source import DataError, DocumentSource
from portachat.i18n import _

STATE_VERSION = 2  # 2: buffer references carry a token offset (fragments of cropped documents)
_NO_SEQ = 1 << 62  # larger than any buffer sequence number, for bisect


class TokenizerLike(Protocol):
    bos_id: int

    def encode_batch(self, texts: list[str], prepend_bos: bool) -> list[list[int]]: ...


class PackedLoader:
    def __init__(
        self,
        source: DocumentSource,
        tokenizer: TokenizerLike,
        batch_size: int,
        seq_len: int,
        stream: int = 0,
        num_streams: int = 1,
        tokenizer_batch_docs: int = 128,
        buffer_docs: int = 1000,
    ):
        for name, value in (("batch_size", batch_size), ("seq_len", seq_len), ("num_streams", num_streams),
                            ("tokenizer_batch_docs", tokenizer_batch_docs), ("buffer_docs", buffer_docs)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(_("{name} must be a positive integer, got {value!r}").format(name=name, value=value))
        if not 0 <= stream < num_streams:
            raise ValueError(_("stream must be in [0, {num_streams}), got {stream}").format(num_streams=num_streams,
                                                                                  stream=stream))
        if source.num_units < num_streams:
            raise DataError(_(
                "{name}: {units} data units are too few for {streams} streams (world_size x grad_accum); give "
                "more data, or use fewer processes / accumulation steps").format(
                name=source.name, units=source.num_units, streams=num_streams))
        self.source = source
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.stream = stream
        self.num_streams = num_streams
        self.tokenizer_batch_docs = tokenizer_batch_docs
        self.buffer_docs = buffer_docs
        self.tokens_per_batch = batch_size * seq_len
        self._units = range(stream, source.num_units, num_streams)
        self._single_pass = False  # set by iter_val_batches: stop after one epoch instead of looping
        self._reset_position()

    def _reset_position(self) -> None:
        self.epoch = 0
        self._unit_pos = 0  # index into self._units
        self._doc_offset = 0  # documents of the current unit already taken
        self.batches = 0
        self._cached_unit: tuple[int, list[str]] | None = None
        # the buffer: seq -> (tokens of the whole document, (unit, doc index, offset)); the entry stands
        # for the fragment tokens[:1] + tokens[1 + offset:], i.e. BOS then the content tokens not yet
        # packed, so a fragment costs no copy. _by_len is sorted (fragment len, seq) for best-fit lookups
        self._docs: dict[int, tuple[list[int], tuple[int, int, int]]] = {}
        self._by_len: list[tuple[int, int]] = []
        self._next_seq = 0

    # ------------------------------------------------------------------------------------------
    # reading documents of this stream

    def _unit_docs(self, unit: int) -> list[str]:
        if self._cached_unit is None or self._cached_unit[0] != unit:
            self._cached_unit = (unit, self.source.read_unit(unit))
        return self._cached_unit[1]

    def _read_next_documents(self) -> tuple[list[str], list[tuple[int, int]]]:
        """Up to tokenizer_batch_docs documents from the cursor on; advances the cursor."""
        texts: list[str] = []
        refs: list[tuple[int, int]] = []
        empty_units = 0
        while len(texts) < self.tokenizer_batch_docs:
            if self._single_pass and self.epoch > 0:
                break
            unit = self._units[self._unit_pos]
            docs = self._unit_docs(unit)
            take = docs[self._doc_offset : self._doc_offset + self.tokenizer_batch_docs - len(texts)]
            texts.extend(take)
            refs.extend((unit, self._doc_offset + i) for i in range(len(take)))
            self._doc_offset += len(take)
            empty_units = empty_units + 1 if not docs else 0
            if empty_units > len(self._units):
                raise DataError(_(
                    "{name}: stream {stream} of {streams} found no non-empty documents in any of its units; the "
                    "data is empty").format(name=self.source.name, stream=self.stream, streams=self.num_streams))
            if self._doc_offset >= len(docs):
                self._unit_pos += 1
                self._doc_offset = 0
                if self._unit_pos == len(self._units):
                    self._unit_pos = 0
                    self.epoch += 1
        return texts, refs

    def _encode(self, texts: list[str]) -> list[list[int]]:
        token_lists = self.tokenizer.encode_batch(texts, prepend_bos=True)
        if len(token_lists) != len(texts):
            raise RuntimeError(_("tokenizer returned {results} results for {texts} texts").format(
                results=len(token_lists), texts=len(texts)))
        return [list(t) for t in token_lists]

    # ------------------------------------------------------------------------------------------
    # the buffer

    def _push(self, tokens: list[int], unit: int, index: int, offset: int = 0) -> None:
        seq = self._next_seq
        self._next_seq += 1
        self._docs[seq] = (tokens, (unit, index, offset))
        bisect.insort(self._by_len, (len(tokens) - offset, seq))

    def _fill_buffer(self) -> None:
        while len(self._docs) < self.buffer_docs:
            texts, refs = self._read_next_documents()
            if not texts:
                return  # single pass finished
            for tokens, (unit, index) in zip(self._encode(texts), refs, strict=True):
                self._push(tokens, unit, index)

    def _largest_fitting(self, space: int) -> int | None:
        """Position in _by_len of the largest fragment of at most `space` tokens, or None."""
        i = bisect.bisect_right(self._by_len, (space, _NO_SEQ))
        if i == 0:
            return None
        # among equally long fragments take the oldest, as a scan of the buffer in order would
        return bisect.bisect_left(self._by_len, (self._by_len[i - 1][0], -1))

    def _next_row(self) -> list[int] | None:
        """T+1 tokens, or None when a single pass has run out of documents."""
        capacity = self.seq_len + 1
        row: list[int] = []
        while len(row) < capacity:
            self._fill_buffer()
            if not self._docs:
                return None
            space = capacity - len(row)
            fitting = self._largest_fitting(space)
            _, seq = self._by_len.pop(0 if fitting is None else fitting)  # none fits: crop the shortest
            tokens, (unit, index, offset) = self._docs.pop(seq)
            start = 1 + offset  # first content token not packed yet
            take = len(tokens) - start if fitting is not None else space - 1
            row.append(tokens[0])
            row.extend(tokens[start : start + take])
            if fitting is None:
                # The crop ends the row, so its last token is a target (never an input) and the
                # remainder starts right after it, behind a fresh BOS: tokens[start + take] is then
                # predicted from BOS alone (its context is lost, the price of BOS-aligned rows), but
                # every content token of the document is a target exactly once, none lost, none
                # repeated. (With space 1 only the BOS is taken and the fragment goes back whole.)
                self._push(tokens, unit, index, offset + take)
        return row

    # ------------------------------------------------------------------------------------------
    # public

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), int64 [batch_size, seq_len] on CPU; targets are inputs shifted by one."""
        rows = []
        for _unused in range(self.batch_size):
            row = self._next_row()
            if row is None:
                raise StopIteration
            rows.append(row)
        self.batches += 1
        batch = torch.tensor(rows, dtype=torch.long)
        return batch[:, :-1].contiguous(), batch[:, 1:].contiguous()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            try:
                yield self.next_batch()
            except StopIteration:
                return

    def _settings(self) -> dict:
        """What a saved position is only valid for: resuming checks these match."""
        return {
            "stream": self.stream,
            "num_streams": self.num_streams,
            "num_units": self.source.num_units,
            "seq_len": self.seq_len,
            "tokenizer_batch_docs": self.tokenizer_batch_docs,
            "buffer_docs": self.buffer_docs,
        }

    def state_dict(self) -> dict:
        """The exact position, JSON-serializable (ints and lists only)."""
        ordered = sorted(self._docs)  # buffer order = insertion order
        return {
            "version": STATE_VERSION,
            **self._settings(),
            "epoch": self.epoch,
            "unit_pos": self._unit_pos,
            "doc_offset": self._doc_offset,
            "batches": self.batches,
            "buffer": [list(self._docs[seq][1]) for seq in ordered],
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly where `state` was taken. The loader must be built with the same stream,
        num_streams, seq_len and data; batch_size may differ (rows come in the same order)."""
        if not isinstance(state, dict) or "version" not in state:
            raise DataError(_("not a data loader state (version {version}): {state}").format(
                version=STATE_VERSION, state=str(state)[:200]))
        if state["version"] != STATE_VERSION:
            raise DataError(_(
                "the data loader state has version {found!r}, this portachat reads version {version} (version 1 "
                "dropped the rest of cropped documents, so its position cannot be continued exactly); start the "
                "run again, or resume from a checkpoint saved by this version").format(
                found=state["version"], version=STATE_VERSION))
        expected = self._settings()
        mismatched = [f"{k}: saved {state.get(k)!r}, now {v!r}" for k, v in expected.items() if state.get(k) != v]
        if mismatched:
            raise DataError(_(
                "cannot resume the data loader exactly, its settings changed ({changes}). Resume with the same "
                "data, seq_len, world_size x grad_accum and loader options").format(changes="; ".join(mismatched)))
        if not 0 <= state["unit_pos"] < len(self._units):
            raise DataError(_("loader state unit_pos {pos} out of range for {units} units").format(
                pos=state["unit_pos"], units=len(self._units)))
        self._reset_position()
        self.epoch = int(state["epoch"])
        self.batches = int(state["batches"])
        self._unit_pos = int(state["unit_pos"])
        self._doc_offset = int(state["doc_offset"])
        try:
            refs = [(int(u), int(i), int(o)) for u, i, o in state["buffer"]]
        except (TypeError, ValueError) as e:
            raise DataError(_("loader state buffer must be [unit, document, offset] triples: {error}").format(
                error=e)) from e
        by_unit: dict[int, list[str]] = {}
        texts = []
        for unit, index, _unused in refs:
            if unit not in by_unit:
                if not 0 <= unit < self.source.num_units or unit % self.num_streams != self.stream:
                    raise DataError(_("loader state refers to unit {unit}, not one of stream {stream}").format(
                        unit=unit, stream=self.stream))
                by_unit[unit] = self.source.read_unit(unit)
            if not 0 <= index < len(by_unit[unit]):
                raise DataError(_("loader state refers to document {index} of unit {unit}, which has fewer").format(
                    index=index, unit=unit))
            texts.append(by_unit[unit][index])
        for start in range(0, len(texts), self.tokenizer_batch_docs):
            chunk = slice(start, start + self.tokenizer_batch_docs)
            for tokens, (unit, index, offset) in zip(self._encode(texts[chunk]), refs[chunk], strict=True):
                # a fragment keeps at least one content token; offset 0 is the whole document
                if offset != 0 and not 0 < offset < len(tokens) - 1:
                    raise DataError(_(
                        "loader state refers to token offset {offset} of document {index} of unit {unit}, which "
                        "has {tokens} tokens; the data or the tokenizer changed").format(
                        offset=offset, index=index, unit=unit, tokens=len(tokens) - 1))
                self._push(tokens, unit, index, offset)

def iter_val_batches(
    source: DocumentSource,
    tokenizer: TokenizerLike,
    batch_size: int,
    seq_len: int,
    max_batches: int | None = None,
    stream: int = 0,
    num_streams: int = 1,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Validation batches: one deterministic pass over `source` (or `max_batches`, if fewer), packed
    like training. The last batch may have fewer rows. With fewer units than streams (a small val
    split), every stream packs all the data and keeps the rows `r % num_streams == stream`.

    A stream may get no rows at all. With one stream that is an error (DataError: there is no
    validation data). With several, the stream just yields nothing: raising on some ranks only would
    leave the others waiting in a collective, so the caller all-reduces what it measured and fails
    on all ranks together when the total is empty."""
    row_sharded = source.num_units < num_streams
    loader = PackedLoader(source, tokenizer, batch_size=1, seq_len=seq_len,
                          stream=0 if row_sharded else stream, num_streams=1 if row_sharded else num_streams)
    loader._single_pass = True
    rows: list[list[int]] = []
    produced = 0
    row_index = 0
    while max_batches is None or produced < max_batches:
        row = loader._next_row()
        if row is not None:
            mine = not row_sharded or row_index % num_streams == stream
            row_index += 1
            if not mine:
                continue
            rows.append(row)
        if rows and (len(rows) == batch_size or row is None):
            batch = torch.tensor(rows, dtype=torch.long)
            yield batch[:, :-1].contiguous(), batch[:, 1:].contiguous()
            produced += 1
            rows = []
        if row is None:
            break
    if row_index == 0 and num_streams == 1:
        raise DataError(_(
            "{name}: validation data has fewer than seq_len + 1 = {tokens} tokens; use a smaller seq_len or more "
            "validation data").format(name=source.name, tokens=seq_len + 1))
