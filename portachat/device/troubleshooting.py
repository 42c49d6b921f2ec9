"""docs/TROUBLESHOOTING.md and docs/TROUBLESHOOTING.zh-CN.md, generated from the diagnosis table.

The table in portachat.device.errors is what the CLI shows when a known error happens; the guide is
the same knowledge to read ahead. Regenerate after editing the table (a test fails when they differ):

    python -m portachat.device.troubleshooting --write
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from portachat.device.errors import RULES, Rule
from portachat.i18n import translate

DOCS = Path(__file__).resolve().parents[2] / "docs"
FILES = {"en": "TROUBLESHOOTING.md", "zh": "TROUBLESHOOTING.zh-CN.md"}

INTRO = {
    "en": (
        "# Troubleshooting\n\n"
        "*Generated from the diagnosis table (`portachat/device/errors.py`) by "
        "`python -m portachat.device.troubleshooting --write`; edit the table, not this file.* "
        "[中文](TROUBLESHOOTING.zh-CN.md)\n\n"
        "When a command fails with a known error, portachat prints the matching entry below instead of a "
        "traceback (`--debug` shows the traceback). Start with `portachat doctor`: it checks the environment "
        "and says what it would choose for your device and why. Before a long run, `portachat estimate memory` "
        "and `portachat tune batch-size` tell you what fits, and `portachat profile` shows where a step's time goes.\n"
    ),
    "zh": (
        "# 故障排查\n\n"
        "*本文由诊断表（`portachat/device/errors.py`）经 `python -m portachat.device.troubleshooting --write` "
        "自动生成；请修改诊断表，而不是本文件。* [English](TROUBLESHOOTING.md)\n\n"
        "命令遇到已知错误时，portachat 会打印下面对应的条目，而不是堆栈信息（加 `--debug` 可看完整堆栈）。"
        "先运行 `portachat doctor`：它检查环境，并说明会为你的设备选择什么、为什么。长时间训练之前，"
        "`portachat estimate memory` 和 `portachat tune batch-size` 告诉你什么配置放得下，"
        "`portachat profile` 显示一步训练的时间花在哪里。\n"
    ),
}
LABELS = {
    "en": {"what": "What happened", "fix": "What to do", "match": "Recognised by"},
    "zh": {"what": "发生了什么", "fix": "怎么办", "match": "识别依据"},
}

def _text(text: str, lang: str) -> str:
    return translate(text, lang, strict=True)  # the Chinese guide never falls back to English


def _slug(title: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in title.lower()).strip("-")


def _match(rule: Rule) -> str:
    parts = []
    if rule.type_names:
        parts.append(", ".join(f"`{name}`" for name in rule.type_names))
    if rule.pattern:
        parts.append(f"`{rule.pattern.replace('|', ' | ')}`")
    return "; ".join(parts)


def render_guide(lang: str = "en") -> str:
    """The whole guide as Markdown, in English ("en") or Chinese ("zh")."""
    labels = LABELS[lang]
    lines = [INTRO[lang], "## " + ("Contents" if lang == "en" else "目录"), ""]
    lines += [f"- [{_text(r.title, lang)}](#{_slug(r.title)})" for r in RULES]
    for rule in RULES:
        lines += ["", f'<a id="{_slug(rule.title)}"></a>', f"## {_text(rule.title, lang)}", "",
                  f"**{labels['what']}:** {_text(rule.what_happened, lang)}", "", f"**{labels['fix']}:**", ""]
        lines += [f"{i}. {_text(remedy, lang)}" for i, remedy in enumerate(rule.remedies, 1)]
        lines += ["", f"<sub>{labels['match']}: {_match(rule)}</sub>"]
    return "\n".join(lines) + "\n"


def write_guides(docs: Path = DOCS) -> list[Path]:
    docs.mkdir(parents=True, exist_ok=True)
    written = []
    for lang, name in FILES.items():
        path = docs / name
        path.write_text(render_guide(lang), encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Generate docs/TROUBLESHOOTING*.md from the diagnosis table.")
    p.add_argument("--write", action="store_true", help="write the files (default: check they are up to date)")
    args = p.parse_args(argv)
    if args.write:
        for path in write_guides():
            print(f"wrote {path}")
        return 0
    stale = [name for lang, name in FILES.items()
             if not (DOCS / name).exists() or (DOCS / name).read_text(encoding="utf-8") != render_guide(lang)]
    if stale:
        print(f"out of date: {', '.join(stale)}; run python -m portachat.device.troubleshooting --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
