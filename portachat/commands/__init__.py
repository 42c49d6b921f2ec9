"""One module per command group; each exposes `register(subparsers)`.

`cli.py` imports the modules listed here in order. A new command is a new module plus a line here.

Every command module is imported to build `portachat --help`, so a module imports the library (which
loads torch: seconds) inside its command function, each such line marked `# deferred: loads torch`;
these are the only imports inside functions that cross a floor (import-linter still checks them).
"""

from __future__ import annotations

import importlib

COMMAND_MODULES = ["doctor", "tokenizer", "train", "train_dpo", "distill", "speedrun", "chat", "generate", "serve", "tune", "estimate", "profile", "eval", "export", "prune", "docs"]


def register_all(sub) -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(f"portachat.commands.{name}").register(sub)
