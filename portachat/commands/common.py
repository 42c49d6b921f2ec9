"""Helpers every command module shares: flag spelling, integer parsing, the deferred dispatch to run/."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable

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


def later(group: str, function: str) -> Callable[[argparse.Namespace], int]:
    """A command's `func`: `portachat.commands.run.<group>.<function>`, imported when the command runs.
    The run modules import the library (torch) at their top; the parsers never import them, so
    building `--help` stays torch-free (tests/commands/test_help_torch_free.py)."""

    def run(args: argparse.Namespace) -> int:
        return getattr(importlib.import_module(f"portachat.commands.run.{group}"), function)(args)

    run.__qualname__ = run.__name__ = function
    run.target = (group, function)  # type: ignore[attr-defined] - what it runs, for tests and debugging
    return run
