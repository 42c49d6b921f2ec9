"""Shapes the device runs well: how far a training batch is padded.

A padded batch is as long as its longest row, rounded up to a bucket, so that compiled graphs and
tuned kernels see a few shapes instead of one per step. Where nothing is compiled (an eager CPU)
a fine bucket wastes the least; elsewhere a ladder of multiples of 64 up to 512, then four steps
per octave (640, 768, 896, 1024, 1280, ...), pads less than 64 positions or a quarter of the row,
with 16 shapes up to 2,048 tokens.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

FINE_STEP = 16  # an eager CPU: a multiple the matmul kernels like, nothing else to gain
COARSE_STEP = 64  # the ladder's smallest step


def pad_bucket(length: int, max_len: int, fine: bool = False) -> int:
    """The padded length of a batch whose longest row has `length` positions, at most `max_len`."""
    length = max(1, int(length))
    if fine:
        step = FINE_STEP
    else:  # a quarter of the octave `length` lies in, at least 64: four shapes per octave past 512
        step = max(COARSE_STEP, 1 << max(0, length.bit_length() - 3))
    return min(max_len, -(-length // step) * step)


def fine_buckets(device_type: str, compiled: bool) -> bool:
    """Whether a device pads to the fine bucket: a CPU running eagerly (no graph to recompile per shape)."""
    return device_type == "cpu" and not compiled


def row_bucket(device_type: str, compiled: bool) -> Callable[[int, int], int]:
    """The bucket function (longest row, max) -> padded length that batches for this device use."""
    return functools.partial(pad_bucket, fine=fine_buckets(device_type, compiled))
