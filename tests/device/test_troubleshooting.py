"""The troubleshooting guide matches the diagnosis table, in both languages, and every command or
flag a remedy names exists."""

from __future__ import annotations

import argparse
import re

from portachat.cli import build_parser
from portachat.device.errors import RULES
from portachat.device.troubleshooting import DOCS, FILES, main, render_guide


def cli_surface() -> tuple[set[str], set[str]]:
    """Every command path ("tune batch-size") and every --flag of the portachat CLI."""
    commands: set[str] = set()
    flags: set[str] = set()

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        for action in parser._actions:
            flags.update(s for s in action.option_strings if s.startswith("--"))
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    commands.add(f"{path} {name}".strip())
                    walk(child, f"{path} {name}".strip())

    walk(build_parser(), "")
    return commands, flags


def test_guides_are_generated_from_the_table():
    assert main([]) == 0, "run: python -m portachat.device.troubleshooting --write"
    en, zh = (DOCS / FILES["en"]).read_text(encoding="utf-8"), (DOCS / FILES["zh"]).read_text(encoding="utf-8")
    for rule in RULES:
        assert rule.title in en and all(remedy in en for remedy in rule.remedies)
    assert "故障排查" in zh and render_guide("zh").count("## ") == render_guide("en").count("## ")


def unknown_references(remedy: str, commands: set[str], flags: set[str]) -> list[str]:
    own = re.sub(r"torchrun[^;()]*", "", remedy)  # torchrun's flags are torchrun's
    bad = [cmd for cmd in re.findall(r"`portachat ([a-z][a-z -]*?)(?: --|`)", own) if cmd.strip() not in commands]
    return bad + [f for f in re.findall(r"(?<![\w-])--[a-z][a-z-]+", own) if f not in flags]


def test_every_remedy_names_commands_and_flags_that_exist():
    commands, flags = cli_surface()
    assert unknown_references("run `portachat tune batchsize` with --run-dir", commands, flags) == [
        "tune batchsize", "--run-dir"]
    for rule in RULES:
        for remedy in rule.remedies:
            assert unknown_references(remedy, commands, flags) == [], remedy
