"""`portachat --help` and every `portachat <command> [<sub>] --help` answer without torch.

Each command group's help runs in a fresh interpreter where importing anything outside the standard
library and portachat raises (torch, numpy, fastapi, tokenizers, ...): the parsers, their defaults and
their help text must come from torch-free modules, and what a command runs is imported only when it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from portachat.cli import build_parser

# Run in the child: block every import beyond the standard library and portachat, then print each
# parser's --help as JSON [(path, exit code, stdout)].
CHILD = r"""
import contextlib, io, json, sys

class BlockThirdParty:
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top != "portachat" and top not in sys.stdlib_module_names:
            raise ImportError(f"{name} imported while building --help")
        return None

sys.meta_path.insert(0, BlockThirdParty())
from portachat.cli import main

results = []
for path in json.loads(sys.argv[1]):
    out = io.StringIO()
    code = None
    with contextlib.redirect_stdout(out):
        try:
            main([*path, "--help"])
        except SystemExit as exc:
            code = exc.code
    results.append([path, code, out.getvalue()])
print(json.dumps(results))
"""


def _paths(parser: argparse.ArgumentParser, path: list[str]) -> list[list[str]]:
    found = [path]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += _paths(child, [*path, name])
    return found


def _groups() -> dict[str, list[list[str]]]:
    """Every parser's path (`[]`, `["train"]`, `["train", "sft"]`, ...), by command group."""
    groups: dict[str, list[list[str]]] = {}
    for path in _paths(build_parser(), []):
        groups.setdefault(path[0] if path else "portachat", []).append(path)
    return groups


GROUPS = _groups()


def test_every_command_is_covered():
    assert {"portachat", "train", "serve", "export", "speedrun", "eval", "chat", "docs"} <= set(GROUPS)
    assert ["train", "sft"] in GROUPS["train"] and ["export", "gguf"] in GROUPS["export"]


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_help_without_third_party_imports(group):
    paths = GROUPS[group]
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(paths)], capture_output=True, text=True,
                          env={**os.environ, "PORTACHAT_LANG": "en", "COLUMNS": "100"}, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout)
    assert [r[0] for r in results] == paths
    for path, code, text in results:
        assert code == 0, (path, code)
        assert text.startswith("usage: portachat" + "".join(f" {p}" for p in path)), (path, text[:200])
        assert "show this help message and exit" in text


def test_import_cli_does_not_import_torch():
    code = "import sys, portachat.cli; print(sorted(m for m in ('torch', 'numpy', 'fastapi') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"


def _funcs(parser: argparse.ArgumentParser):
    func = parser.get_default("func")
    if func is not None:
        yield func
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield from _funcs(child)


def test_every_command_runs_a_function_of_its_run_module():
    import importlib

    targets = {func.target for func in _funcs(build_parser())}
    assert ("train", "cmd_train_chat") in targets and ("serve", "cmd_serve") in targets
    for group, function in sorted(targets):
        module = importlib.import_module(f"portachat.commands.run.{group}")
        assert callable(getattr(module, function)), (group, function)
