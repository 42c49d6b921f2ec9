"""Preference pairs for DPO-family training: read in TRL's layouts, rendered with the chat template, batched.

Accepted rows (jsonl lines or parquet rows), one pair each, as TRL's preference datasets hold them:
  {"prompt": "...", "chosen": "...", "rejected": "..."}                       standard, explicit prompt
  {"prompt": [messages], "chosen": [messages], "rejected": [messages]}        conversational, explicit prompt
  {"chosen": [messages], "rejected": [messages]}                              conversational, implicit prompt
                                                                              (the messages both share)
A string prompt is one user message and a string reply one assistant message, so every pair is rendered
with the model's chat template, as SFT renders conversations (TRL concatenates standard-layout strings
without a template). An optional "answer" (the verifiable answer) is kept for task evaluations.

A pair becomes two rows, prompt + chosen and prompt + rejected, whose targets are the tokens after the
prompt (TRL's completion: the reply and the template's end of turn); every token of the prompt, earlier
assistant turns included, is masked out as in SFT. A batch holds the chosen rows first, then the rejected rows in the same
order (TRL's concatenated layout), so one forward scores both.

Stream s of n reads pairs s, s+n, ... of a per-epoch seeded shuffle; (epoch, index) is its whole state.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from portachat.data.batch import Batch
from portachat.data.chat_data import chat_files, data_rows
from portachat.data.chat_loader import Bucket, Render, rows_to_batch
from portachat.data.document_source import DataError
from portachat.device.shapes import pad_bucket
from portachat.i18n import _
from portachat.tokenizer.chat import normalize_messages
from portachat.tokenizer.errors import ChatFormatError

Messages = list[dict[str, Any]]
Prompt = Callable[[Messages], list[int]]  # messages -> the ids that ask for the next assistant reply


@dataclass
class PreferencePair:
    prompt: Messages  # ends with a user (or tool) message
    chosen: Messages  # the preferred reply (ends with an assistant message)
    rejected: Messages
    answer: str | None = None  # the verifiable answer, when the row has one


def _as_messages(value: Any, role: str, field: str, where: str) -> Messages:
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, Sequence) and value and all(isinstance(m, Mapping) for m in value):
        for i, m in enumerate(value):
            if "role" not in m or "content" not in m:
                raise DataError(_("{where}: '{field}' message {index} needs 'role' and 'content'").format(
                    where=where, field=field, index=i))
        return [dict(m) for m in value]
    raise DataError(_("{where}: '{field}' must be a string or a non-empty list of {{'role', 'content'}} messages, "
                      "got {type}").format(where=where, field=field, type=type(value).__name__))


def _shared_prefix(a: Messages, b: Messages) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def row_to_pair(row: Any, where: str = "row") -> PreferencePair:
    """One row in a TRL preference layout -> a PreferencePair; a DataError names `where` (file:line)."""
    if not isinstance(row, Mapping):
        raise DataError(_("{where}: expected a JSON object, got {type}").format(where=where, type=type(row).__name__))
    missing = [k for k in ("chosen", "rejected") if k not in row]
    if missing:
        raise DataError(_("{where}: a preference row needs 'chosen' and 'rejected' (and usually 'prompt'); missing "
                          "{missing}, got keys {keys}").format(where=where, missing=", ".join(missing),
                                                              keys=sorted(row)[:8]))
    chosen = _as_messages(row["chosen"], "assistant", "chosen", where)
    rejected = _as_messages(row["rejected"], "assistant", "rejected", where)
    if row.get("prompt") is not None:
        prompt = _as_messages(row["prompt"], "user", "prompt", where)
    else:  # implicit prompt: the messages both conversations begin with
        n = _shared_prefix(chosen, rejected)
        while n and chosen[n - 1]["role"] == "assistant":  # a shared assistant turn is part of the reply
            n -= 1
        if n == 0:
            raise DataError(_("{where}: without 'prompt', 'chosen' and 'rejected' must be conversations that begin "
                              "with the same prompt messages").format(where=where))
        prompt, chosen, rejected = chosen[:n], chosen[n:], rejected[n:]
    if prompt[-1]["role"] == "assistant":
        raise DataError(_("{where}: the prompt ends with an assistant message; it must end with the user's turn "
                          "the replies answer").format(where=where))
    for name, reply in (("chosen", chosen), ("rejected", rejected)):
        if reply[-1]["role"] != "assistant":
            raise DataError(_("{where}: '{field}' must end with an assistant message").format(where=where, field=name))
        try:
            normalize_messages(prompt + reply)
        except ChatFormatError as exc:
            raise DataError(_("{where}: '{field}': {error}").format(where=where, field=name, error=exc)) from None
    answer = row.get("answer")
    return PreferencePair(prompt, chosen, rejected, None if answer is None else str(answer))


def load_pairs(specs: Sequence[str | Path], limit: int | None = None) -> list[PreferencePair]:
    """Every preference pair in the files `specs` name (files or directories), in order."""
    out: list[PreferencePair] = []
    for spec in specs:
        for file in chat_files(spec):
            for where, row in data_rows(file):
                out.append(row_to_pair(row, where))
                if limit is not None and len(out) >= limit:
                    return out
    if not out:
        raise DataError(_("--data {spec}: no preference pairs found").format(spec=", ".join(map(str, specs))))
    return out


def pair_to_row(pair: PreferencePair) -> dict[str, Any]:
    """A PreferencePair as a row in TRL's conversational layout with an explicit prompt."""
    row: dict[str, Any] = {"prompt": pair.prompt, "chosen": pair.chosen, "rejected": pair.rejected}
    if pair.answer is not None:
        row["answer"] = pair.answer
    return row


# ----------------------------------------------------------------------------- rendering


def reply_row(pair: PreferencePair, reply: Messages, render: Render, prompt: Prompt,
              max_tokens: int) -> tuple[list[int], list[int]]:  # fmt: skip
    """(ids, mask) of prompt + reply, at most `max_tokens` long, supervising every token after the prompt (as
    TRL does: the reply and whatever the template closes its turn with). The prompt ends where its own
    rendering (with the generation prompt) and the whole conversation's part ways."""
    ids, _mask = render(pair.prompt + reply, max_tokens)
    asked = prompt(pair.prompt)
    start = 0
    while start < min(len(asked), len(ids)) and asked[start] == ids[start]:
        start += 1
    return ids, [0] * start + [1] * (len(ids) - start)


def pair_rows(pair: PreferencePair, render: Render, prompt: Prompt, max_tokens: int
              ) -> tuple[tuple[list[int], list[int]], tuple[list[int], list[int]]]:  # fmt: skip
    return (reply_row(pair, pair.chosen, render, prompt, max_tokens),
            reply_row(pair, pair.rejected, render, prompt, max_tokens))


@dataclass
class PreferenceBatch(Batch):
    """2P rows (chosen rows, then rejected rows) plus which pairs they are and, when cached, the
    reference model's summed log-probs of each row."""

    pair_index: torch.Tensor | None = None  # int64 [P]: each pair's index in the data set
    ref_logps: torch.Tensor | None = None  # float [2P]: reference log-probs (chosen, then rejected); None = live

    @property
    def num_pairs(self) -> int:
        return self.inputs.size(0) // 2

    def to(self, device: torch.device) -> PreferenceBatch:
        moved = super().to(device)
        ref = self.ref_logps.to(device, non_blocking=True) if self.ref_logps is not None else None
        return PreferenceBatch(**{f.name: getattr(moved, f.name) for f in fields(Batch)},
                               pair_index=self.pair_index, ref_logps=ref)


def pairs_to_batch(rows: Sequence[tuple[tuple[list[int], list[int]], tuple[list[int], list[int]]]], pad_id: int,
                   max_len: int, bucket: Bucket = pad_bucket, pair_index: Sequence[int] | None = None,
                   ref_logps: torch.Tensor | None = None) -> PreferenceBatch:
    """Rendered pairs -> one batch: every chosen row, then every rejected row (TRL's concatenated order)."""
    flat = [c for c, _r in rows] + [r for _c, r in rows]
    batch = rows_to_batch(flat, pad_id, max_len, bucket)
    index = torch.tensor(list(pair_index), dtype=torch.long) if pair_index is not None else None
    return PreferenceBatch(**{f.name: getattr(batch, f.name) for f in fields(Batch)}, pair_index=index,
                           ref_logps=ref_logps)


def trainable(rows: tuple[tuple[list[int], list[int]], tuple[list[int], list[int]]]) -> bool:
    """Both replies keep at least one supervised target (after the row's first token) within the row."""
    return all(any(mask[1:]) for _ids, mask in rows)


class PreferenceLoader:
    """Batches of `batch_size` pairs, resumable; `ref_logps` [N, 2] (chosen, rejected) rides along if given."""

    def __init__(self, pairs: Sequence[PreferencePair], render: Render, prompt: Prompt, pad_id: int, batch_size: int,
                 seq_len: int, stream: int = 0, num_streams: int = 1, seed: int = 0, bucket: Bucket = pad_bucket,
                 ref_logps: torch.Tensor | None = None,
                 row_cache: dict[int, tuple[tuple[list[int], list[int]], tuple[list[int], list[int]]]] | None = None,
                 ) -> None:  # fmt: skip
        if len(pairs) < num_streams:
            raise DataError(_("{n} preference pairs cannot feed {streams} streams (devices x accumulation steps); "
                              "give more pairs or fewer devices").format(n=len(pairs), streams=num_streams))
        self.pairs, self.render, self.prompt, self.pad_id = pairs, render, prompt, pad_id
        self.batch_size, self.seq_len, self.bucket = batch_size, seq_len, bucket
        self.stream, self.num_streams, self.seed = stream, num_streams, seed
        self.ref_logps = ref_logps
        self.rows = row_cache if row_cache is not None else {}
        self.epoch, self.index = 0, 0

    def order(self, epoch: int) -> list[int]:
        order = list(range(len(self.pairs)))
        random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order[self.stream :: self.num_streams]

    def rendered(self, i: int) -> tuple[tuple[list[int], list[int]], tuple[list[int], list[int]]]:
        if i not in self.rows:
            self.rows[i] = pair_rows(self.pairs[i], self.render, self.prompt, self.seq_len + 1)
        return self.rows[i]

    def next_batch(self) -> PreferenceBatch:
        picked: list[int] = []
        while len(picked) < self.batch_size:
            mine = self.order(self.epoch)
            if self.index >= len(mine):
                self.epoch, self.index = self.epoch + 1, 0
                continue
            picked.append(mine[self.index])
            self.index += 1
        ref = self.ref_logps[picked].t().reshape(-1) if self.ref_logps is not None else None
        return pairs_to_batch([self.rendered(i) for i in picked], self.pad_id, self.seq_len, self.bucket, picked, ref)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])


def all_pair_batches(pairs: Sequence[PreferencePair], render: Render, prompt: Prompt, pad_id: int, batch_size: int,
                     seq_len: int, indices: Sequence[int], bucket: Bucket = pad_bucket) -> Iterator[PreferenceBatch]:
    """The pairs at `indices`, in order, `batch_size` at a time (reference log-probs, evaluation)."""
    for start in range(0, len(indices), batch_size):
        picked = list(indices[start : start + batch_size])
        rows = [pair_rows(pairs[i], render, prompt, seq_len + 1) for i in picked]
        yield pairs_to_batch(rows, pad_id, seq_len, bucket, picked)
