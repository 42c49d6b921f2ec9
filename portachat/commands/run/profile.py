"""`portachat profile`: K training or decode steps under torch.profiler.

What runs. The flags are in commands/profile.py, which `--help` imports without torch."""

from __future__ import annotations

import argparse
from pathlib import Path

from portachat.commands.common import usage_error
from portachat.commands.run.common import device_from_args
from portachat.device import DeviceError
from portachat.i18n import _
from portachat.model import ConfigError, GPTConfig
from portachat.train.profile import (
    format_breakdown,
    profile_decode,
    profile_training,
)


def cmd_profile(args: argparse.Namespace) -> int:
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
