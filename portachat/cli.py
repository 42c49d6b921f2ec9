"""`portachat <command>`: parses flags and calls the library, nothing more.

Every training command also runs as `torchrun --nproc_per_node=N -m portachat train base ...`.
Flags accept both `--device-batch-size` and nanochat's `--device_batch_size` spelling.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

from portachat.commands import register_all
from portachat.commands.common import EPILOG, int_at_least
from portachat.device.early_env import apply_early_defaults
from portachat.i18n import _, gettext
from portachat.i18n.argparse_messages import HelpFormatter, translate_argparse

__all__ = ["build_parser", "int_at_least", "main"]


def build_parser() -> argparse.ArgumentParser:
    translate_argparse()  # "usage:", "options" and argparse's errors in the user's language
    parser = argparse.ArgumentParser(
        prog="portachat",
        description=_("Train and serve your own small ChatGPT on any accelerator (NVIDIA, AMD, Hygon DCU, Ascend NPU, Intel XPU, Apple, CPU)."),
        epilog=EPILOG,
    )
    parser.add_argument("--debug", action="store_true", help=_("show full tracebacks instead of a diagnosis"))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    register_all(sub)
    _localize(parser)
    return parser


def _localize(parser: argparse.ArgumentParser) -> None:
    """Every parser, subcommands included: the shared EPILOG (a module constant marked with N_) translated,
    and help wrapped by display width so Chinese lines fit the terminal."""
    parser.epilog = gettext(parser.epilog) if parser.epilog else parser.epilog
    parser.formatter_class = HelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in set(action.choices.values()):
                _localize(child)


def _report_error(exc: BaseException, debug: bool) -> int:
    from portachat.device.explain import diagnose, format_diagnosis  # deferred: loads torch

    if debug:
        traceback.print_exc()
    diagnosis = diagnose(exc)
    if diagnosis is not None:
        print(format_diagnosis(diagnosis), file=sys.stderr)  # it says how to get the traceback
    else:
        print(_("portachat: error: {error}").format(error=exc), file=sys.stderr)
        if not debug:
            print(_("(run with --debug for the full traceback)"), file=sys.stderr)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    apply_early_defaults()  # first: the NPU/DCU runtime settings must be in place before torch is imported
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = args.debug or os.environ.get("PORTACHAT_DEBUG") == "1"
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt as exc:
        print("\n" + _("portachat: interrupted") + (f": {exc}" if str(exc) else ""), file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the top-level handler turns errors into a diagnosis
        return _report_error(exc, debug)


if __name__ == "__main__":
    raise SystemExit(main())
