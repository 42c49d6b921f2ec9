"""`portachat profile`: K training or decode steps under torch.profiler."""

from __future__ import annotations

import argparse
from pathlib import Path

from portachat.commands.common import EPILOG, device_from_args, flag, nonneg_int, positive_int, usage_error
from portachat.i18n import _


def cmd_profile(args: argparse.Namespace) -> int:
    from portachat.device import DeviceError  # deferred: loads torch
    from portachat.model import ConfigError, GPTConfig  # deferred: loads torch
    from portachat.train.profile import (  # deferred: loads torch
        format_breakdown,
        profile_decode,
        profile_training,
    )

    try:
        dev = device_from_args(args)
        cfg = GPTConfig.from_depth(args.depth, args.vocab_size, max_seq_len=args.max_seq_len + args.steps + args.warmup + 1)
    except (DeviceError, ConfigError) as e:
        return usage_error(e)
    dev.set_current()
    out = Path(args.out)
    print(f"[profile] {args.mode}: " + _("{steps} steps after {warmup} warmup on {device} {name} ({dtype}, compile "
                                         "{compile}); depth {depth}, batch {batch} x {seq}").format(
        steps=args.steps, warmup=args.warmup, device=f"{dev.kind}:{dev.index}", name=repr(dev.name),
        dtype=dev.dtype_name, compile=dev.compile_backend, depth=cfg.n_layer, batch=args.device_batch_size,
        seq=args.max_seq_len), flush=True)
    if args.mode == "train":
        result = profile_training(cfg, dev, out, args.device_batch_size, args.max_seq_len, args.steps, args.warmup)
    else:
        result = profile_decode(cfg, dev, out, args.device_batch_size, args.max_seq_len, args.steps, args.warmup)
    print("[profile] " + _("Chrome trace: {path} ({events} events; open in {url})").format(
        path=result.trace_path, events=f"{result.events:,}", url="https://ui.perfetto.dev"))
    print("\n" + _("top operators:"))
    print(result.top_ops)
    print(format_breakdown(result))
    return 0


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
    p.set_defaults(func=cmd_profile)
