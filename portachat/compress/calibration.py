"""Calibration batches: token rows from a text file or a chat dataset, for measuring importance
and perplexity. Text goes through the pretraining sources (portachat.data.sources), conversations
through the chat datasets (portachat.data.chat_data) rendered with the model's own chat template;
either way the tokens are concatenated and cut into rows of equal length."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from portachat.data.chat_data import load_conversations
from portachat.data.document_source import DataError
from portachat.data.sources import open_source
from portachat.i18n import _

TEXT_SUFFIXES = (".txt", ".txt.gz")
BATCH_ROWS = 4


def calibration_tokens(spec: str | Path, encode: Callable[[str], list[int]],
                       render: Callable[[Any, int | None], tuple[list[int], list[int]]], need: int) -> list[int]:
    """At least `need` token ids from `spec` (fewer only when the data runs out): a text file or
    directory, or chat conversations (.jsonl/.json/.parquet)."""
    path = Path(spec).expanduser()
    if not path.exists():
        raise DataError(_("--data {spec}: no such file or directory; give a text file (.txt) or a chat dataset "
                          "(.jsonl with messages)").format(spec=spec))
    ids: list[int] = []
    if path.name.endswith(TEXT_SUFFIXES):
        for doc in open_source(path, split="train").iter_documents():
            ids += encode(doc)
            if len(ids) >= need:
                break
        return ids
    for conv in load_conversations([path], limit=need):  # every conversation is at least one token
        ids += render(conv["messages"], None)[0]
        if len(ids) >= need:
            break
    return ids


def calibration_batches(ids: Sequence[int], num_samples: int, seq_len: int, skip: int = 0) -> list[torch.Tensor]:
    """`num_samples` rows of `seq_len` + 1 tokens (inputs and their next tokens), after skipping the
    first `skip` rows, in batches of up to BATCH_ROWS rows."""
    width = seq_len + 1
    have = len(ids) // width - skip
    if have < num_samples:
        raise DataError(_("the calibration data holds {have} rows of {width} tokens, fewer than the {need} asked "
                          "for: give more data or pass a smaller --calibration-samples / --seq-len").format(
            have=max(have, 0), width=width, need=num_samples))
    rows = torch.tensor(ids[skip * width:(skip + num_samples) * width], dtype=torch.long).view(num_samples, width)
    return list(rows.split(BATCH_ROWS))
