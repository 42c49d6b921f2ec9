"""What the run modules share: the device the flags ask for, a training stage's last lines."""

from __future__ import annotations

import argparse

from portachat.device import Device, get_device
from portachat.i18n import _


def device_from_args(args: argparse.Namespace) -> Device:
    """The Device for --device / --dtype / --compile (each None = auto / environment)."""
    compile_flag = None if getattr(args, "compile", None) is None else args.compile == "1"
    return get_device(kind=getattr(args, "device", None), dtype=getattr(args, "dtype", None), compile=compile_flag)


def report_result(result, is_main: bool) -> int:
    """A training stage's last lines (rank 0, when it saved a model): its steps and metrics, and where the model is."""
    if result.final_checkpoint is not None and is_main:
        shown = ", ".join(f"{k} {v:.4f}" for k, v in result.metrics.items() if isinstance(v, float))
        print("[portachat] " + _("done: {steps} steps; {metrics}").format(steps=result.steps, metrics=shown))
        print("[portachat] " + _("model: {path}").format(path=result.final_checkpoint))
    return 0
