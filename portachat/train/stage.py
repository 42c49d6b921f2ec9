"""The one horizon planner for the chat-shaped stages.

`plan_iterations()`: optimizer steps for a number of epochs over conversations, however rows are
packed, padded or drawn by a token budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from portachat.data.chat_data import Conversation
from portachat.data.chat_loader import Bucket, batches_per_epoch
from portachat.device.shapes import pad_bucket
from portachat.train.trainer import TrainConfig

Render = Callable[[Any, int | None], tuple[list[int], list[int]]]  # (messages, max tokens) -> ids, mask


def plan_iterations(convs: Sequence[Conversation], render: Render, cfg: TrainConfig, pack: bool, epochs: float,
                    streams: int, bucket: Bucket = pad_bucket, length_cache: dict[int, int] | None = None) -> int:
    """Optimizer steps for `epochs` passes over the conversations (packing estimated from a sample)."""
    per_epoch = batches_per_epoch(convs, render, cfg.max_seq_len, pack, int(cfg.device_batch_size), streams,
                                  cfg.tokens_per_batch, bucket, seed=cfg.seed, length_cache=length_cache)
    return max(1, math.ceil(epochs * per_epoch))
