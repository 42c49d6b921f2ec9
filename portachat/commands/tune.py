"""`portachat tune batch-size`: the largest device batch that fits, by running real training steps."""

from __future__ import annotations

import argparse

from portachat.commands.common import EPILOG, flag, later, positive_int
from portachat.i18n import _

UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20, "mib": 2**20,
         "g": 2**30, "gb": 2**30, "gib": 2**30, "t": 2**40, "tb": 2**40, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """'24GiB', '512M', '1.5g', '1000000' -> bytes (binary units)."""
    raw = text.strip().lower().replace(" ", "")
    number = raw.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = raw[len(number):]
    try:
        value = float(number)
    except ValueError:
        value = -1
    if unit not in UNITS or value <= 0:
        raise argparse.ArgumentTypeError(
            _("expected a size such as 24GiB, 512MiB or 2000000 (bytes), got {text}").format(text=repr(text)))
    return int(value * UNITS[unit])


def register(sub) -> None:
    p = sub.add_parser("tune", help=_("find settings by measurement (batch size)"), epilog=EPILOG)
    what = p.add_subparsers(dest="what", metavar="batch-size", required=True)
    t = what.add_parser(
        "batch-size", epilog=EPILOG,
        help=_("the largest device batch that fits, found by running real training steps"),
        description=_("Runs real forward + backward + optimizer steps at growing batch sizes (doubling, then a "
                    "binary search), catching out-of-memory errors on every device, and keeps the largest batch "
                    "whose peak stays under --safety x the memory limit (the device's memory, or --memory-limit)."))
    flag(t, "--depth", type=positive_int, default=4, help=_("model depth (default 4)"))
    flag(t, "--vocab-size", type=positive_int, default=32768, help=_("vocabulary size (default 32768)"))
    flag(t, "--max-seq-len", type=positive_int, default=256, help=_("tokens per row (default 256)"))
    flag(t, "--device", default=None, help=_("cpu|cuda|rocm|dcu|npu|xpu|mps (default: auto-detect)"))
    flag(t, "--dtype", default=None, help=_("bf16|fp16|fp32 (default: the device's choice)"))
    flag(t, "--memory-limit", type=parse_bytes, default=None,
         help=_("memory to fit in, e.g. 24GiB (default: the device's total memory; on CPU the system's)"))
    flag(t, "--safety", type=float, default=0.9, help=_("use at most this fraction of the limit (default 0.9)"))
    flag(t, "--max-batch-size", type=positive_int, default=1024, help=_("stop searching above this (default 1024)"))
    flag(t, "--total-batch-size", type=positive_int, default=None,
         help=_("tokens per optimizer step: also print the gradient accumulation it needs"))
    flag(t, "--activation-checkpointing", action="store_true", help=_("recompute each block in backward"))
    flag(t, "--json", action="store_true", help=_("print the result as JSON"))
    t.set_defaults(func=later("tune", "cmd_tune_batch_size"), compile=None)
