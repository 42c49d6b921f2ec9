"""Batches of rendered conversations with loss masks, packed or padded, resumable.

Each conversation renders (portachat.tokenizer.chat) to ids and a mask; a target whose mask is 0
becomes -1, so the loss skips it. Rows hold seq_len + 1 tokens:
  packed (mid-training): whole conversations back to back; one that does not fit the row's
    remaining space starts the next row, and the gap is padding (mask 0);
  padded (SFT): one conversation per row, padded.
A conversation longer than a row is cut to the row. Stream s of n reads conversations s, s+n, ...
of a per-epoch shuffle; its position (epoch, index) is all its state.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

import torch

from portachat.data.batch import Batch
from portachat.data.chat_data import Conversation
from portachat.tokenizer import Tokenizer, render_conversation


def rows_to_batch(rows: list[tuple[list[int], list[int]]], seq_len: int, pad_id: int) -> Batch:
    """(ids, mask) rows of up to seq_len + 1 tokens -> Batch; short rows are padded, unsupervised."""
    ids = torch.full((len(rows), seq_len + 1), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), seq_len + 1), dtype=torch.bool)
    for r, (row_ids, row_mask) in enumerate(rows):
        ids[r, : len(row_ids)] = torch.tensor(row_ids, dtype=torch.long)
        mask[r, : len(row_mask)] = torch.tensor(row_mask, dtype=torch.bool)
    targets = ids[:, 1:].masked_fill(~mask[:, 1:], -1)
    return Batch(ids[:, :-1].contiguous(), targets.contiguous())


class ChatLoader:
    def __init__(
        self,
        conversations: Sequence[Conversation],
        tokenizer: Tokenizer,
        batch_size: int,
        seq_len: int,
        pack: bool = True,
        stream: int = 0,
        num_streams: int = 1,
        seed: int = 0,
    ) -> None:
        if not conversations:
            raise ValueError("ChatLoader needs at least one conversation")
        self.conversations, self.tokenizer = conversations, tokenizer
        self.batch_size, self.seq_len, self.pack = batch_size, seq_len, pack
        self.stream, self.num_streams, self.seed = stream, num_streams, seed
        self.epoch, self.index = 0, 0  # index into this stream's share of the epoch's order
        self._order: list[int] | None = None

    def _epoch_order(self) -> list[int]:
        if self._order is None:
            order = list(range(len(self.conversations)))
            random.Random(f"portachat-chat:{self.seed}:{self.epoch}").shuffle(order)
            # Every stream gets at least one conversation, even with fewer conversations than streams.
            mine = order[self.stream % len(order) :: self.num_streams] or [order[self.stream % len(order)]]
            self._order = mine
        return self._order

    def _peek(self) -> tuple[list[int], list[int]]:
        conv = self.conversations[self._epoch_order()[self.index]]
        return render_conversation(self.tokenizer, conv["messages"], max_tokens=self.seq_len + 1)

    def _advance(self) -> None:
        self.index += 1
        if self.index >= len(self._epoch_order()):
            self.epoch, self.index, self._order = self.epoch + 1, 0, None

    def _next_row(self) -> tuple[list[int], list[int]]:
        ids, mask = self._peek()
        self._advance()
        if not self.pack:
            return ids, mask
        room = self.seq_len + 1
        while len(ids) < room:
            more_ids, more_mask = self._peek()
            if len(ids) + len(more_ids) > room:
                break  # starts the next row
            ids, mask = ids + more_ids, mask + more_mask
            self._advance()
        return ids, mask

    def next_batch(self) -> Batch:
        rows = [self._next_row() for _ in range(self.batch_size)]
        return rows_to_batch(rows, self.seq_len, self.tokenizer.bos_id)

    def __iter__(self) -> Iterator[Batch]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index, "count": len(self.conversations), "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state.get("count") != len(self.conversations) or state.get("seed") != self.seed:
            return  # other data: start from the beginning
        self.epoch, self.index, self._order = int(state["epoch"]), int(state["index"]), None


def iter_chat_val_batches(
    conversations: Sequence[Conversation],
    tokenizer: Tokenizer,
    batch_size: int,
    seq_len: int,
    rank: int = 0,
    world: int = 1,
    max_batches: int | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One pass over this rank's share of `conversations`, one per row, for validation."""
    mine = list(conversations[rank::world])
    rows: list[tuple[list[int], list[int]]] = []
    produced = 0
    for conv in mine:
        rows.append(render_conversation(tokenizer, conv["messages"], max_tokens=seq_len + 1))
        if len(rows) == batch_size:
            batch = rows_to_batch(rows, seq_len, tokenizer.bos_id)
            yield batch.inputs, batch.targets
            rows, produced = [], produced + 1
            if max_batches is not None and produced >= max_batches:
                return
    if rows:
        batch = rows_to_batch(rows, seq_len, tokenizer.bos_id)
        yield batch.inputs, batch.targets
