"""`portachat speedrun`: the whole pipeline, tokenizer to report card, in one resumable command.

What runs. The flags are in commands/speedrun.py, which `--help` imports without torch."""

from __future__ import annotations

import argparse

from portachat.commands.launch import maybe_launch
from portachat.commands.run.common import device_from_args
from portachat.device import destroy_distributed
from portachat.speedrun.pipeline import SpeedrunOptions, run_speedrun


def cmd_speedrun(args: argparse.Namespace) -> int:
    launched = maybe_launch(args)
    if launched is not None:
        return launched

    dev = device_from_args(args)
    opts = SpeedrunOptions(
        run=args.run, preset=args.preset, data_dir=args.data_dir, runs_root=args.runs_root,
        price_per_device_hour=args.price_per_device_hour, overwrite=args.overwrite, stop_after=args.stop_after,
        seed=args.seed,
    )
    try:
        run_speedrun(opts, dev=dev)
    finally:
        destroy_distributed()
    return 0
