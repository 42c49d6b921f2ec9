"""Helpers every command module shares: flag spelling, integer parsing, device from flags."""

from __future__ import annotations

import argparse
import sys

from portachat.i18n import N_, _

# Shown translated: cli.build_parser passes every parser's epilog through gettext.
EPILOG = N_("Docs: README.md. Environment: PORTACHAT_HOME (runs, caches), PORTACHAT_DEVICE, PORTACHAT_DTYPE, PORTACHAT_COMPILE, "
                "PORTACHAT_LANG (zh|en).")


def flag(parser: argparse.ArgumentParser | argparse._ArgumentGroup, name: str, **kwargs) -> None:
    """Add `--some-flag`, also accepting `--some_flag`."""
    names = [name]
    if "-" in name[2:]:
        names.append("--" + name[2:].replace("-", "_"))
    parser.add_argument(*names, **kwargs)


def report_result(result, is_main: bool) -> int:
    """A training stage's last lines (rank 0, when it saved a model): its steps and metrics, and where the model is."""
    if result.final_checkpoint is not None and is_main:
        shown = ", ".join(f"{k} {v:.4f}" for k, v in result.metrics.items() if isinstance(v, float))
        print("[portachat] " + _("done: {steps} steps; {metrics}").format(steps=result.steps, metrics=shown))
        print("[portachat] " + _("model: {path}").format(path=result.final_checkpoint))
    return 0


def usage_error(message: object) -> int:
    """Print a bad-input message the way every command does and return exit code 2."""
    print(_("error: {message}").format(message=message), file=sys.stderr)
    return 2


def int_at_least(minimum: int):
    """An argparse type: an integer >= `minimum`, with a message that says so."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(_("expected an integer, got {text}").format(text=repr(text))) from None
        if value < minimum:
            raise argparse.ArgumentTypeError(_("must be at least {minimum}, got {value}").format(minimum=minimum, value=value))
        return value

    return parse


positive_int = int_at_least(1)
nonneg_int = int_at_least(0)


def device_from_args(args: argparse.Namespace):
    """The Device for --device / --dtype / --compile (each None = auto / environment)."""
    from portachat.device import get_device  # deferred: loads torch

    compile_flag = None if getattr(args, "compile", None) is None else args.compile == "1"
    return get_device(kind=getattr(args, "device", None), dtype=getattr(args, "dtype", None), compile=compile_flag)
