"""Batches of rendered conversations with loss masks, packed or padded, resumable.

Each conversation renders (portachat.tokenizer.chat, or a model's own template) to ids and a mask;
a target whose mask is 0 becomes -1, so the loss skips it. A row holds up to seq_len + 1 tokens:
  packed (mid-training, `--rows pack`): whole conversations back to back; one that does not fit the
    row's remaining space starts the next row. Each conversation keeps its own positions (0, 1, ...)
    and attends only to itself (the batch carries `positions`; the device layer masks attention);
  padded (SFT): one conversation per row.
A conversation longer than a row is cut to the row. A batch is as long as its longest row, rounded
up to the device layer's bucket (portachat.device.shapes.pad_bucket), never seq_len + 1 for short
conversations; the batch says how many of its positions are real (`Batch.lengths`).

Rows per batch: `batch_size`, or with `tokens_per_batch` as many as fit that many padded positions
(the dynamic batch sampler: conversations sorted by length within pools of POOL, cut into batches,
the batches shuffled; packed rows are about seq_len long, so it is tokens_per_batch // seq_len rows).
Padded rows of a fixed count are grouped by length the same way (batch_size per batch), so a batch's
rows are about as long as each other and little of it is padding.

Stream s of n reads conversations s, s+n, ... of a per-epoch seeded shuffle; its position (epoch,
index: conversations, or batches with a token budget, read this epoch) is all its state.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from portachat.data.batch import Batch
from portachat.data.chat_data import Conversation
from portachat.device.shapes import pad_bucket
from portachat.i18n import _
from portachat.tokenizer import Tokenizer, render_conversation

POOL = 1024  # conversations sorted by length together (token-budget batches, length-grouped batches)
Bucket = Callable[[int, int], int]  # (longest row's input positions, max) -> padded length
Render = Callable[[Any, int | None], tuple[list[int], list[int]]]  # (messages, max tokens) -> ids, mask
# (ids, mask) of one conversation per row, or (ids, mask, parts): a packed row and its conversations' sizes
Row = tuple[list[int], list[int]] | tuple[list[int], list[int], list[int]]


def rows_to_batch(rows: Sequence[Row], pad_id: int, max_len: int, bucket: Bucket = pad_bucket) -> Batch:
    """Rows of up to max_len + 1 tokens -> a Batch of bucket(longest row's inputs, max_len) positions;
    short rows are padded, unsupervised. Packed rows (with parts) also give each token its position
    within its own conversation, and the first token of every conversation is never a target."""
    width = bucket(max(max(len(r[0]) - 1 for r in rows), 1), max_len)
    ids = torch.full((len(rows), width + 1), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width + 1), dtype=torch.bool)
    positions = None
    lengths: list[int] = []
    if any(len(r) == 3 and len(r[2]) > 1 for r in rows):
        positions = torch.arange(width).repeat(len(rows), 1)
    for i, row in enumerate(rows):
        row_ids, row_mask = row[0][: width + 1], row[1][: width + 1]
        ids[i, : len(row_ids)] = torch.tensor(row_ids, dtype=torch.long)
        mask[i, : len(row_mask)] = torch.tensor(row_mask, dtype=torch.bool)
        parts = list(row[2]) if len(row) == 3 else [len(row_ids)]
        parts[-1] -= 1  # the row's last token is only a target
        lengths.extend(p for p in parts if p > 0)
        if positions is not None:
            start = 0
            for p in parts[:-1]:
                positions[i, start : start + p] = torch.arange(p)
                start += p
                mask[i, start] = False  # the next conversation's first token: never predicted across
            positions[i, start:] = torch.arange(width - start)  # the last one, then padding continuing it
    targets = ids[:, 1:].masked_fill(~mask[:, 1:], -1)
    return Batch(ids[:, :-1].contiguous(), targets.contiguous(), positions=positions, lengths=tuple(lengths))


class ChatLoader:
    def __init__(
        self,
        conversations: Sequence[Conversation],
        tokenizer: Tokenizer | None,
        batch_size: int,
        seq_len: int,
        pack: bool = True,
        stream: int = 0,
        num_streams: int = 1,
        seed: int = 0,
        *,
        tokens_per_batch: int | None = None,
        bucket: Bucket = pad_bucket,
        render: Render | None = None,
        pad_id: int | None = None,
        length_cache: dict[int, int] | None = None,
        group_by_length: bool = True,
    ) -> None:
        """`render`/`pad_id`: a model's own chat template and padding id (default: ours, bos).
        `length_cache`: conversation index -> rendered length, shared by the streams of one stage.
        `group_by_length`: padded rows of a fixed count come in batches of similar lengths (False: any)."""
        if not conversations:
            raise ValueError("ChatLoader needs at least one conversation")
        if tokens_per_batch is not None and tokens_per_batch < seq_len:
            raise ValueError(_("--tokens-per-batch {tokens} must be at least --max-seq-len {seq_len}: a batch must "
                               "hold one whole row").format(tokens=tokens_per_batch, seq_len=seq_len))
        self.conversations, self.tokenizer = conversations, tokenizer
        self.batch_size, self.seq_len, self.pack = batch_size, seq_len, pack
        self.stream, self.num_streams, self.seed = stream, num_streams, seed
        self.tokens_per_batch, self.bucket, self.group_by_length = tokens_per_batch, bucket, group_by_length
        if render is None:
            if tokenizer is None:
                raise ValueError("ChatLoader needs a tokenizer or a render function")
            render = lambda messages, n: render_conversation(tokenizer, messages, max_tokens=n)  # noqa: E731
        self.render = render
        self.pad_id = pad_id if pad_id is not None else tokenizer.bos_id  # type: ignore[union-attr]
        self.lengths = length_cache if length_cache is not None else {}
        self.epoch, self.index = 0, 0  # index into this stream's share of the epoch (or its batches)
        self._order: list[int] | None = None
        self._plan: list[list[int]] | None = None

    @property
    def by_budget(self) -> bool:
        """Padded rows drawn by a token budget (packed rows only change how many rows a batch has)."""
        return self.tokens_per_batch is not None and not self.pack

    @property
    def grouped(self) -> bool:
        """Padded rows of a fixed count: batches of similar lengths (packed rows are all about seq_len)."""
        return self.group_by_length and not self.pack and self.tokens_per_batch is None

    def _epoch_order(self) -> list[int]:
        if self._order is None:
            order = list(range(len(self.conversations)))
            random.Random(f"portachat-chat:{self.seed}:{self.epoch}").shuffle(order)
            # Every stream gets at least one conversation, even with fewer conversations than streams.
            mine = order[self.stream % len(order) :: self.num_streams] or [order[self.stream % len(order)]]
            self._order = self._grouped(mine) if self.grouped else mine
        return self._order

    def _grouped(self, mine: list[int]) -> list[int]:
        """`mine` reordered so that each run of batch_size conversations has similar lengths: pools of
        about POOL sorted by length and cut into batches, the batches shuffled (a short last one stays
        last, so every other batch lines up with one)."""
        size = self.batch_size
        pool = size * max(1, POOL // size)
        groups = []
        for start in range(0, len(mine), pool):
            part = sorted(mine[start : start + pool], key=self._length)
            groups += [part[i : i + size] for i in range(0, len(part), size)]
        tail = groups.pop() if len(groups[-1]) < size else None
        random.Random(f"portachat-chat-groups:{self.seed}:{self.epoch}:{self.stream}").shuffle(groups)
        return [i for group in groups + ([tail] if tail else []) for i in group]

    def _render(self, i: int) -> tuple[list[int], list[int]]:
        ids, mask = self.render(self.conversations[i]["messages"], self.seq_len + 1)
        self.lengths[i] = len(ids)
        return ids, mask

    def _length(self, i: int) -> int:
        """Input positions conversation i fills in its own row (its tokens but the last, up to seq_len)."""
        if i not in self.lengths:
            self._render(i)
        return max(1, min(self.lengths[i], self.seq_len + 1) - 1)

    def epoch_plan(self) -> list[list[int]]:
        """This epoch's batches of conversation indices under the token budget: each pool of POOL
        conversations (in the epoch's shuffled order) sorted by length and cut where one more row would
        pass the budget, then every batch shuffled (seeded by seed, epoch and stream)."""
        if self._plan is None:
            budget = self.tokens_per_batch or 0
            mine, batches = self._epoch_order(), []
            for start in range(0, len(mine), POOL):
                current: list[int] = []
                longest = 0
                for i in sorted(mine[start : start + POOL], key=self._length):
                    grown = max(longest, self._length(i))
                    if current and self.bucket(grown, self.seq_len) * (len(current) + 1) > budget:
                        batches.append(current)
                        current, grown = [], self._length(i)
                    current.append(i)
                    longest = grown
                if current:
                    batches.append(current)
            random.Random(f"portachat-chat-batches:{self.seed}:{self.epoch}:{self.stream}").shuffle(batches)
            self._plan = batches
        return self._plan

    def prepare(self) -> ChatLoader:
        """Render what this epoch's order needs now (lengths, for grouped or budgeted batches), not
        inside the first training step."""
        if self.by_budget:
            self.epoch_plan()
        else:
            self._epoch_order()
        return self

    def _peek(self) -> tuple[list[int], list[int]]:
        return self._render(self._epoch_order()[self.index])

    def _advance(self) -> None:
        self.index += 1
        if self.index >= len(self._epoch_order()):
            self.epoch, self.index, self._order, self._plan = self.epoch + 1, 0, None, None

    def _next_row(self) -> Row:
        ids, mask = self._peek()
        self._advance()
        if not self.pack:
            return ids, mask
        parts = [len(ids)]
        room = self.seq_len + 1
        while len(ids) < room:
            more_ids, more_mask = self._peek()
            if len(ids) + len(more_ids) > room:
                break  # starts the next row
            ids, mask = ids + more_ids, mask + more_mask
            parts.append(len(more_ids))
            self._advance()
        return ids, mask, parts

    def rows_per_batch(self) -> int:
        if self.tokens_per_batch is not None and self.pack:
            return max(1, self.tokens_per_batch // self.seq_len)
        return self.batch_size

    def next_batch(self) -> Batch:
        if self.by_budget:
            plan = self.epoch_plan()
            rows: list[Row] = [self._render(i) for i in plan[self.index]]
            self.index += 1
            if self.index >= len(plan):
                self.epoch, self.index, self._order, self._plan = self.epoch + 1, 0, None, None
        else:
            rows = []
            for _ in range(self.rows_per_batch()):
                rows.append(self._next_row())
                if self.grouped and self.index == 0:
                    break  # the epoch's last (short) group: the next epoch's groups start a batch of their own
        return rows_to_batch(rows, self.pad_id, self.seq_len, self.bucket)

    def __iter__(self) -> Iterator[Batch]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict:
        state = {"epoch": self.epoch, "index": self.index, "count": len(self.conversations), "seed": self.seed}
        if self.by_budget:
            state["tokens_per_batch"] = self.tokens_per_batch
        return state

    def load_state_dict(self, state: dict) -> None:
        same_budget = state.get("tokens_per_batch") == (self.tokens_per_batch if self.by_budget else None)
        if state.get("count") != len(self.conversations) or state.get("seed") != self.seed or not same_budget:
            return  # other data or batching: start from the beginning
        self.epoch, self.index, self._order, self._plan = int(state["epoch"]), int(state["index"]), None, None


def iter_chat_val_batches(
    conversations: Sequence[Conversation],
    tokenizer: Tokenizer | None,
    batch_size: int,
    seq_len: int,
    rank: int = 0,
    world: int = 1,
    max_batches: int | None = None,
    *,
    bucket: Bucket = pad_bucket,
    render: Render | None = None,
    pad_id: int | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One pass over this rank's share of `conversations`, one per row, each batch padded to its longest
    row's bucket: (inputs, targets), as evaluate_bpb reads them."""
    if render is None:
        render = lambda messages, n: render_conversation(tokenizer, messages, max_tokens=n)  # noqa: E731
    pad = pad_id if pad_id is not None else tokenizer.bos_id  # type: ignore[union-attr]
    mine = list(conversations[rank::world])
    produced = 0
    for start in range(0, len(mine), batch_size):
        rows = [render(conv["messages"], seq_len + 1) for conv in mine[start : start + batch_size]]
        batch = rows_to_batch(rows, pad, seq_len, bucket)
        yield batch.inputs, batch.targets
        produced += 1
        if max_batches is not None and produced >= max_batches:
            return


def batches_per_epoch(conversations: Sequence[Conversation], render: Render, seq_len: int, pack: bool,
                      batch_size: int, streams: int, tokens_per_batch: int | None = None, bucket: Bucket = pad_bucket,
                      seed: int = 0, length_cache: dict[int, int] | None = None) -> float:
    """Micro-batches one of `streams` streams reads per epoch: exact for a token budget over padded rows
    (stream 0's plan), estimated from 200 sampled conversations for packed rows."""
    if tokens_per_batch is not None and not pack:
        loader = ChatLoader(conversations, None, batch_size, seq_len, pack=False, num_streams=streams, seed=seed,
                            tokens_per_batch=tokens_per_batch, bucket=bucket, render=render, pad_id=0,
                            length_cache=length_cache)
        return float(len(loader.epoch_plan()))
    rows: float = len(conversations)
    if pack:
        sample = list(conversations[:: max(1, len(conversations) // 200)][:200])
        mean = sum(len(render(c["messages"], seq_len + 1)[0]) for c in sample) / len(sample)
        rows = len(conversations) * mean / (seq_len + 1)
        batch_size = max(1, tokens_per_batch // seq_len) if tokens_per_batch else batch_size
    return rows / (batch_size * streams)


@dataclass(frozen=True)
class DataLengths:
    """Token counts of chat data as a stage renders it (conversations cut to the row)."""

    conversations: int  # how many were rendered (all, or an even sample)
    mean: float  # input positions per conversation
    longest: int
    mean_supervised: float
    most_supervised: int

    def micro_batch(self, batch_size: int, seq_len: int, bucket: Callable[[int, int], int],
                    tokens_per_batch: int | None = None) -> tuple[int, int, int]:
        """(rows, padded length, supervised positions) of the largest micro-batch this data makes:
        `batch_size` rows padded to the longest conversation's bucket, or the token budget's worth."""
        width = bucket(self.longest, seq_len)
        if tokens_per_batch:
            rows = max(1, tokens_per_batch // width)
            return rows, width, min(rows * self.most_supervised, tokens_per_batch)
        return batch_size, width, batch_size * self.most_supervised


def longest_chat_row(convs: Sequence[Conversation], render: Render, seq_len: int, bucket: Bucket, pack: bool,
                     lengths: dict[int, int]) -> int:
    """The widest batch the data makes: its longest conversation's bucket (packed rows: the whole row).
    Every rendered length goes into `lengths` (what `ChatLoader(length_cache=...)` keeps: the stage's
    loaders and planner share it, so nothing is rendered twice)."""
    if pack:
        return seq_len
    for i, conv in enumerate(convs):
        if i not in lengths:
            lengths[i] = len(render(conv["messages"], seq_len + 1)[0])
    longest = max((max(1, min(n, seq_len + 1) - 1) for n in lengths.values()), default=1)
    return bucket(longest, seq_len)


def data_lengths(conversations: Sequence[Any], render: Callable[[Any, int | None], tuple[list[int], list[int]]],
                 seq_len: int, sample: int = 5000) -> DataLengths:
    """Lengths of (up to `sample`, evenly spaced) conversations rendered for rows of seq_len + 1 tokens."""
    picked = list(conversations[:: max(1, len(conversations) // sample)][:sample])
    if not picked:
        raise ValueError("no conversations to measure")
    lengths, supervised = [], []
    for conv in picked:
        ids, mask = render(conv["messages"], seq_len + 1)
        lengths.append(max(1, len(ids) - 1))
        supervised.append(sum(mask[1:]))
    return DataLengths(len(picked), sum(lengths) / len(lengths), max(lengths), sum(supervised) / len(supervised),
                       max(supervised))
