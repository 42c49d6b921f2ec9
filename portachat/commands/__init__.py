"""One module per command group; each exposes `register(subparsers)`.

`cli.py` imports the modules listed here in order. A new command is a new module plus a line here.

Every command module is imported to build `portachat --help`, so it holds only the flags and
imports nothing that loads torch (tests/commands/test_help_torch_free.py): the defaults it shows
come from torch-free homes (train/defaults.py, train/optim_config.py, ...). What a command runs is
in `commands/run/<group>.py`, which imports the library at its top; the parser names it with
`common.later(group, function)`, imported only when the command runs.
"""

from __future__ import annotations

import importlib

COMMAND_MODULES = ["doctor", "tokenizer", "train", "train_dpo", "distill", "speedrun", "chat", "generate", "serve", "tune", "estimate", "profile", "eval", "export", "prune", "docs"]


def register_all(sub) -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(f"portachat.commands.{name}").register(sub)
