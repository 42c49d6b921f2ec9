"""The compression report: `report.md` with a before/after table and `compress.png` beside it
(bars per metric, as the speedrun's report card draws its curves: matplotlib, Agg, saved PNG)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from portachat.i18n import N_, _, gettext

# (key, label, better): the metrics drawn and tabled, in order.
METRICS = [
    ("params", N_("parameters"), "lower"),
    ("perplexity", N_("perplexity"), "lower"),
    ("gsm8k_accuracy", N_("GSM8K accuracy"), "higher"),
    ("decode_tok_s", N_("decode tok/s"), "higher"),
]


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.4g}"


def plot_before_after(columns: dict[str, dict[str, Any]], path: Path) -> Path | None:
    """One bar group per metric that has numbers, one bar per column (before, pruned, healed)."""
    import matplotlib  # deferred: heavy, plots only

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt  # deferred: heavy, plots only

    # English labels: a plot font may lack CJK glyphs (the table beside it is translated)
    shown = [(k, label) for k, label, _better in METRICS if all(c.get(k) is not None for c in columns.values())]
    if not shown:
        return None
    fig, axes = plt.subplots(1, len(shown), figsize=(3.2 * len(shown), 3.2), dpi=110)
    axes = axes if len(shown) > 1 else [axes]
    for ax, (key, label) in zip(axes, shown, strict=True):
        names = list(columns)
        ax.bar(names, [float(columns[n][key]) for n in names], color=["#888888", "#d08040", "#4080c0"][: len(names)])
        ax.set_title(label)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def render_report(columns: dict[str, dict[str, Any]], notes: list[str], plot: Path | None) -> str:
    names = list(columns)
    lines = ["# " + _("portachat compress"), ""]
    lines += ["| " + _("metric") + " | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for key, label, better in METRICS:
        cells = " | ".join(_fmt(columns[n].get(key)) for n in names)
        hint = _("lower is better") if better == "lower" else _("higher is better")
        lines.append(f"| {gettext(label)} ({hint}) | {cells} |")
    lines.append("")
    if plot is not None:
        lines += [f"![before and after]({plot.name})", ""]
    lines += [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


def write_report(directory: Path, columns: dict[str, dict[str, Any]], notes: list[str],
                 heal: str | None = None) -> Path:
    """report.md, report.json and compress.png in `directory`; returns report.md's path. `heal`: the
    heal step that ran (compress/heal.py's name for it), None when none did."""
    plot = plot_before_after(columns, directory / "compress.png")
    body = {"columns": columns, "heal": heal, "notes": notes}
    (directory / "report.json").write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
    path = directory / "report.md"
    path.write_text(render_report(columns, notes, plot), encoding="utf-8")
    return path
