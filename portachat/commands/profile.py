"""`portachat profile`: K training or decode steps under torch.profiler."""

from __future__ import annotations

from portachat.commands.common import EPILOG, flag, later, nonneg_int, positive_int
from portachat.i18n import _


def register(sub) -> None:
    p = sub.add_parser(
        "profile", epilog=EPILOG,
        help=_("profile training or decode steps: Chrome trace, top operators, step-time breakdown"),
        description=_("Runs K steps under torch.profiler and writes a Chrome trace, prints the top operators and "
                    "a step-time breakdown (data wait / forward / backward / optimizer / communication)."))
    flag(p, "--mode", choices=("train", "decode"), default="train", help=_("what to profile (default train)"))
    flag(p, "--steps", type=positive_int, default=3, help=_("profiled steps (default 3)"))
    flag(p, "--warmup", type=nonneg_int, default=1, help=_("unprofiled steps first (default 1)"))
    flag(p, "--depth", type=positive_int, default=4, help=_("model depth (default 4)"))
    flag(p, "--vocab-size", type=positive_int, default=32768, help=_("vocabulary size (default 32768)"))
    flag(p, "--device-batch-size", type=positive_int, default=4, help=_("sequences per step (default 4)"))
    flag(p, "--max-seq-len", type=positive_int, default=256,
         help=_("tokens per training row; the prompt length in decode mode (default 256)"))
    flag(p, "--device", default=None, help=_("cpu|cuda|rocm|dcu|npu|xpu|mps (default: auto-detect)"))
    flag(p, "--dtype", default=None, help=_("bf16|fp16|fp32 (default: the device's choice)"))
    flag(p, "--compile", default=None, choices=["0", "1"], help=_("torch.compile the model (default: device policy)"))
    flag(p, "--out", default="profile", help=_("directory for the trace (default ./profile)"))
    p.set_defaults(func=later("profile", "cmd_profile"))
