"""The speedrun's report card: `report.md` in the run directory, with curves as PNG files beside it.

Everything comes from what the stages wrote (each stage's `log.jsonl`) and from the speedrun's own
state file, so the report can be rebuilt at any time without rerunning anything.
"""

from __future__ import annotations

import json
import math
import platform
from pathlib import Path
from typing import Any

import torch

import portachat
from portachat.i18n import N_, _, gettext
from portachat.storage.atomic import write_text_atomic

# (stage, log key, label) curves drawn when the stage logged them.
CURVES: dict[str, list[tuple[str, str]]] = {
    "loss": [("base", "loss"), ("mid", "loss"), ("sft", "loss")],
    "validation": [("base", "val/bpb"), ("mid", "val/bpb"), ("sft", "val/bpb")],
    "rl_reward": [("rl", "reward"), ("rl", "pass_at_k")],
    "rl_length": [("rl", "response_length")],
}
LOG_SCALE = {"loss"}  # the chat stages' losses sit far below pretraining's: a log axis shows both
PER_TASK_CURVES = {"rl_reward": ("rl", "reward/")}  # plus one curve per task the stage logged under this prefix


def read_log(path: Path) -> list[dict[str, Any]]:
    """Records of a stage's log.jsonl (a resumed run's later entries replace earlier ones per step)."""
    if not path.is_file():
        return []
    by_step: dict[tuple[int, tuple[str, ...]], dict[str, Any]] = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(raw)
        except json.JSONDecodeError:
            continue  # a line cut short by a crash
        if isinstance(rec, dict) and "step" in rec:
            by_step[(int(rec["step"]), tuple(sorted(rec)))] = rec
    return [by_step[k] for k in sorted(by_step)]


def series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    steps, values = [], []
    for rec in records:
        value = rec.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            steps.append(int(rec["step"]))
            values.append(float(value))
    return steps, values


def plot_curves(run_dir: Path, out_dir: Path) -> list[tuple[str, Path]]:
    """One PNG per curve group that has data; returns [(title, path)]."""
    import matplotlib  # deferred: heavy, plots only

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt  # deferred: heavy, plots only

    made = []
    for name, curves in CURVES.items():
        drawn = 0
        keys_seen: set[str] = set()
        fig, ax = plt.subplots(figsize=(7, 3.6), dpi=110)
        extra = []
        if name in PER_TASK_CURVES:
            stage, prefix = PER_TASK_CURVES[name]
            keys = {k for rec in read_log(run_dir / stage / "log.jsonl") for k in rec if k.startswith(prefix)}
            extra = [(stage, k) for k in sorted(keys)]
        for stage, key in [*curves, *extra]:
            records = read_log(run_dir / stage / "log.jsonl")
            steps, values = series(records, key)
            if len(values) < 1:
                continue
            ax.plot(steps, values, marker="." if len(values) < 30 else None, label=f"{stage} {key}")
            drawn += 1
            keys_seen.add(key)
        if not drawn:
            plt.close(fig)
            continue
        if name in LOG_SCALE:
            ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel(", ".join(sorted(keys_seen)))
        ax.set_title(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / f"curve_{name}.png"
        fig.savefig(path)
        plt.close(fig)
        made.append((name, path))
    return made


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.4f}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = float(seconds)
    return _("{n} min").format(n=f"{seconds / 60:.1f}") if seconds >= 90 else _("{n} s").format(n=f"{seconds:.0f}")


def render_report(state: dict[str, Any], hardware: dict[str, Any], curves: list[tuple[str, Path]], run_dir: Path) -> str:
    """The markdown text of the report, in the user's language (stage, metric and task names stay as logged)."""
    lines = ["# " + _("portachat speedrun: {run}").format(run=state.get("run", run_dir.name)), ""]
    lines.append(_("Preset **{preset}**, data: {data}.").format(preset=state.get("preset"),
                                                              data=gettext(state.get("data_note", "-"))))
    lines.append("")
    lines.append("## " + _("Hardware and software"))
    lines.append("")
    for key, value in hardware.items():
        lines.append(f"- {gettext(key)}: {value}")
    lines.append("")
    stages = state.get("stages", {})
    price = float(state.get("price_per_device_hour", 0.0))
    devices = int(state.get("world_size", 1))
    lines.append("## " + _("Stages"))
    lines.append("")
    lines.append(_("Cost assumes {price} USD per device-hour x {n} device(s) (`--price-per-device-hour`).").format(
        price=f"{price:.2f}", n=devices))
    lines.append("")
    lines.append("| " + " | ".join([_("stage"), _("status"), _("time"), _("est. cost (USD)"), _("key metrics")]) + " |")
    lines.append("|---|---|---|---|---|")
    total_s = 0.0
    for name, info in stages.items():
        seconds = info.get("seconds")
        total_s += float(seconds or 0.0)
        cost = (float(seconds) / 3600 * price * devices) if seconds is not None else None
        metrics = ", ".join(f"{k} {_fmt(v)}" for k, v in (info.get("metrics") or {}).items())
        status = _("done") if info.get("done") else _("not finished")
        lines.append(f"| {name} | {status} | {_duration(seconds)} | {_fmt(cost)} | {metrics or '-'} |")
    lines.append(f"| **{_('total')}** | | {_duration(total_s)} | {_fmt(total_s / 3600 * price * devices)} | |")
    lines.append("")
    evals = state.get("evals") or {}
    if evals:
        lines.append("## " + _("Evaluations"))
        lines.append("")
        columns = sorted({task for results in evals.values() for task in results if "/" not in task})
        lines.append(f"| {_('model')} | " + " | ".join(columns) + " |")
        lines.append("|---|" + "---|" * len(columns))
        for stage_name, results in evals.items():
            lines.append(f"| {stage_name} | " + " | ".join(_fmt(results.get(c)) for c in columns) + " |")
        lines.append("")
        subtasks = sorted({task for results in evals.values() for task in results if "/" in task})
        if subtasks:  # one row per subtask, one column per model: what each stage changed
            lines.append(f"| {_('task')} | " + " | ".join(evals) + " |")
            lines.append("|---|" + "---|" * len(evals))
            for task in subtasks:
                lines.append(f"| {task} | " + " | ".join(_fmt(r.get(task)) for r in evals.values()) + " |")
            lines.append("")
    if curves:
        lines.append("## " + _("Curves"))
        lines.append("")
        for title, path in curves:
            lines.append(f"![{title}]({path.relative_to(run_dir).as_posix()})")
            lines.append("")
    final = state.get("final_model")
    if final:
        lines.append("## " + _("Use the model"))
        lines.append("")
        lines.append("```bash")
        lines.append(f"portachat chat --model {final}")
        lines.append(f"portachat serve --model {final}")
        lines.append("```")
        lines.append("")
    return "\n".join(lines)


def write_report(run_dir: Path, state: dict[str, Any], hardware: dict[str, Any]) -> Path:
    """Draw the curves and write `report.md` (atomically: a reader never sees half a report)."""
    run_dir = Path(run_dir)
    curves = plot_curves(run_dir, run_dir)
    text = render_report(state, hardware, curves, run_dir)
    path = run_dir / "report.md"
    write_text_atomic(path, text + "\n")
    return path


def hardware_summary(dev, world_size: int) -> dict[str, Any]:
    """Hardware and versions for the report, asked of the device layer."""
    info = dev.describe()
    return {
        N_("device"): f"{world_size} x {info.get('name', dev.kind)} ({dev.kind})",
        "dtype": f"{dev.dtype_name} ({dev.dtype_reason})",
        "compile": f"{dev.compile_backend} ({dev.compile_reason})",
        "collective": dev.dist_backend,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "portachat": getattr(portachat, "__version__", "dev"),
        N_("host"): f"{platform.machine()}, {platform.system()} {platform.release()}",
    }
