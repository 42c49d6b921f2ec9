"""`portachat tune batch-size`: the largest device batch that fits, by running real training steps.

What runs. The flags are in commands/tune.py, which `--help` imports without torch."""

from __future__ import annotations

import argparse
import json

from portachat.commands.common import usage_error
from portachat.commands.run.common import device_from_args
from portachat.device import DeviceError
from portachat.i18n import _
from portachat.model import ConfigError, GPTConfig
from portachat.train.accumulation import TrainingError
from portachat.train.batch_size import find_batch_size


def cmd_tune_batch_size(args: argparse.Namespace) -> int:
    try:
        dev = device_from_args(args)
        cfg = GPTConfig.from_depth(args.depth, args.vocab_size, max_seq_len=args.max_seq_len)
    except (DeviceError, ConfigError) as e:
        return usage_error(e)
    dev.set_current()
    say = (lambda _m: None) if args.json else (lambda m: print(f"[tune] {m}", flush=True))
    say(_("device {device} {name}, {dtype}; model depth {depth}, vocab {vocab}, {seq_len} tokens per row").format(
        device=f"{dev.kind}:{dev.index}", name=repr(dev.name), dtype=dev.dtype_name, depth=cfg.n_layer,
        vocab=cfg.vocab_size, seq_len=args.max_seq_len)
        + (_(", activation checkpointing") if args.activation_checkpointing else ""))
    try:
        result = find_batch_size(cfg, args.max_seq_len, dev, memory_limit=args.memory_limit, safety=args.safety,
                                 max_batch_size=args.max_batch_size,
                                 activation_checkpointing=args.activation_checkpointing, say=say)
    except ValueError as e:
        return usage_error(e)
    batch_for_total = accum = None
    if args.total_batch_size and result.batch_size:
        try:
            batch_for_total, accum = result.batch_for_total(args.total_batch_size, args.max_seq_len)
        except TrainingError as e:
            return usage_error(e)
    if args.json:
        print(json.dumps({"device_batch_size": result.batch_size, "limit_bytes": result.limit_bytes,
                          "safety": result.safety, "grad_accum_steps": accum,
                          "device_batch_size_for_total": batch_for_total,
                          "probes": [vars(p) for p in result.probes]}))
    elif result.batch_size == 0:
        print("[tune] " + _("not even batch size 1 fits: use a smaller --depth or --max-seq-len, "
                            "--activation-checkpointing, or more memory (--memory-limit)"))
    else:
        line = "[tune] " + _("largest device batch size: {n} (--device-batch-size {n})").format(n=result.batch_size)
        if accum is not None:
            line += _("; with --total-batch-size {total}: {accum} accumulation step(s)").format(
                total=args.total_batch_size, accum=accum)
        print(line)
    return 0 if result.batch_size > 0 else 1
