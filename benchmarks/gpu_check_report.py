"""summary.json and summary.md for benchmarks/gpu_check.sh, from its status.tsv and each part's log.

    python benchmarks/gpu_check_report.py OUT_DIR --mode gpu|dry-run

Each part keeps its status (ok / failed / timeout), seconds and budget, and the figures its log holds;
the issue's goals for the first lent H100 are recorded (never failed on): training MFU >= 45% counted
as the kernel works, engine decode >= 5x transformers at batch 32, graphs and eager identical in fp32.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

PARTS = ("doctor", "train_throughput", "profile", "train_base", "estimate", "engine_graphs", "decode")
SDPA_KERNELS = ("flash", "cudnn", "efficient", "math", "npu_fusion_attention", "scaled_dot_product")


def last_json(text: str) -> dict | None:
    """The last line that is a JSON object (the scripts' --json record)."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def whole_json(text: str) -> dict | None:
    """A JSON document printed over several lines (doctor --json, estimate --json)."""
    start = text.find("{\n")
    if start < 0:
        return last_json(text)
    try:
        return json.loads(text[start:])
    except ValueError:
        return None


def doctor(text: str, out: Path) -> dict:
    d = whole_json(text) or {}
    dev = d.get("device") or {}
    return {"ok": d.get("ok"), "device": dev.get("name"), "runtime_env": dev.get("env_defaults"), "kind": dev.get("kind"), "dtype": dev.get("dtype"),
            "attention": dev.get("attention_backend"), "attention_reason": dev.get("attention_reason"),
            "compile": dev.get("compile_backend"), "peak_flops": (d.get("probes") or {}).get("peak_flops")}


def train_throughput(text: str, out: Path) -> dict:
    d = last_json(text) or {}
    res = d.get("results") or {}
    ours, ref = res.get("portachat") or {}, res.get("reference") or {}
    return {"ours_tok_s": ours.get("tok_per_s"), "reference_tok_s": ref.get("tok_per_s"), "ratio": d.get("ratio"),
            "ours_mfu": ours.get("mfu"), "ours_peak_memory_bytes": ours.get("peak_memory_bytes"),
            "compile": d.get("compile"), "dtype": d.get("dtype")}


def profile(text: str, out: Path) -> dict:
    lines = text.splitlines()
    split = {}
    at = next((i for i, line in enumerate(lines) if line.startswith("step-time breakdown")), None)
    if at is not None:
        for line in lines[at + 1:]:
            m = re.match(r"\s+(\w+)\s+([\d,.]+) ms\s+([\d.]+)%", line)
            if not m:
                break
            split[m.group(1)] = {"ms": float(m.group(2).replace(",", "")), "share": float(m.group(3)) / 100}
    kernels = sorted({w for line in lines for w in re.findall(r"[\w:]+", line)
                      if any(k in w.lower() for k in SDPA_KERNELS)})
    return {"split": split, "attention_kernels_seen": kernels[:12], "note": "eager step (compile 0)"}


def train_base(text: str, out: Path, run: str = "gpu_check") -> dict:
    logs = sorted(out.glob(f"runs/{run}/base/log.jsonl"))
    rows = [json.loads(line) for path in logs for line in path.read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "loss" in r and "dt_s" in r]
    later = steps[1:] or steps  # the first step carries compilation
    return {"steps": len(steps), "peak_memory_bytes": max((r.get("mem_bytes") or 0 for r in steps), default=None),
            "tok_s": sum(r["tok_per_s"] for r in later) / len(later) if later else None,
            "mfu": later[-1].get("mfu") if later else None,
            "loader_wait_s": [r[k] for r in steps for k in r if "wait" in k][:10] or None}


def estimate(text: str, out: Path) -> dict:
    d = whole_json(text) or {}
    return {"training_peak_bytes": (d.get("training") or {}).get("peak_bytes"),
            "peak_phase": (d.get("training") or {}).get("peak_phase")}


def engine_graphs(text: str, out: Path) -> dict:
    return last_json(text) or {}


def decode(text: str, out: Path) -> dict:
    d = last_json(text) or {}
    return {"dtype": d.get("dtype"), "by_batch": {str(r["batch"]): {"ours_tok_s": r["ours_tok_s"], "hf_tok_s": r["hf_tok_s"],
                                                                     "ratio": r["ratio"]} for r in d.get("results", [])}}


def goals(parts: dict, mode: str) -> dict:
    if mode != "gpu":
        return {"note": "dry run: toy sizes on the CPU, goals not evaluated"}
    tt = parts["train_throughput"]["result"]
    dec = parts["decode"]["result"].get("by_batch", {}).get("32", {})
    fp32 = (parts["engine_graphs"]["result"].get("graphs_vs_eager") or [{}])[0]
    return {"train_mfu_ge_45pct": None if tt.get("ours_mfu") is None else tt["ours_mfu"] >= 0.45,
            "decode_batch32_ge_5x_transformers": None if dec.get("ratio") is None else dec["ratio"] >= 5,
            "graphs_equal_eager_fp32": fp32.get("identical")}


def read_parts(out: Path, names: tuple[str, ...], parse) -> dict:
    """Each part's status line (status.tsv) and the figures `parse(name, log_text)` reads from its log."""
    status = {}
    for line in (out / "status.tsv").read_text().splitlines():
        name, state, rc, seconds, budget = line.split("\t")
        status[name] = {"status": state, "rc": int(rc), "seconds": int(seconds), "budget_s": int(budget)}
    parts = {}
    for name in names:
        log = out / f"{name}.log"
        entry = status.get(name, {"status": "not run", "rc": None, "seconds": None, "budget_s": None})
        try:
            entry["result"] = parse(name, log.read_text(errors="replace")) if log.exists() else {}
        except (ValueError, KeyError, TypeError) as exc:  # a log that does not parse is a finding
            entry["result"] = {"unreadable": f"{type(exc).__name__}: {exc}"}
        parts[name] = entry
    return parts


def summarize(out: Path, mode: str) -> dict:
    parts = read_parts(out, PARTS, lambda name, text: globals()[name](text, out))
    device = parts["doctor"]["result"].get("device")
    measured = parts["train_base"]["result"].get("peak_memory_bytes")
    estimated = parts["estimate"]["result"].get("training_peak_bytes")
    memory = {"train_peak_bytes": measured, "estimated_peak_bytes": estimated,
              "measured_over_estimate": measured / estimated if measured and estimated else None}
    return {"mode": mode, "device": device, "parts": parts, "memory": memory, "goals": goals(parts, mode),
            "total_seconds": sum(p["seconds"] or 0 for p in parts.values())}


def markdown(s: dict) -> str:
    lines = [f"# GPU check ({s['mode']}) on {s['device'] or 'unknown device'}", "",
             f"Total {s['total_seconds']} s.", "", "| part | status | seconds / budget | figures |", "|---|---|---|---|"]
    for name, p in s["parts"].items():
        figures = json.dumps(p["result"], default=str)
        if len(figures) > 400:
            figures = figures[:400] + "..."
        lines.append(f"| {name} | {p['status']} | {p['seconds']} / {p['budget_s']} | `{figures}` |")
    m = s["memory"]
    lines += ["", "## Training memory", "",
              f"peak {m['train_peak_bytes']} bytes measured over 10 steps (on a CPU: process memory), "
              f"estimate {m['estimated_peak_bytes']} bytes, ratio {m['measured_over_estimate']}"]
    lines += ["", "## Goals (recorded, not enforced)", ""]
    lines += [f"- {k}: {v}" for k, v in s["goals"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="the directory gpu_check.sh wrote")
    p.add_argument("--mode", choices=("gpu", "dry-run"), default="gpu")
    args = p.parse_args(argv)
    summary = summarize(args.out, args.mode)
    return write_summary(args.out, summary, markdown(summary), "gpu_check")


def write_summary(out: Path, summary: dict, text: str, tag: str) -> int:
    """summary.json and summary.md (`text`) in `out`, the markdown printed; 1 when a part is not ok."""
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (out / "summary.md").write_text(text)
    print(text)
    failed = [n for n, part in summary["parts"].items() if part["status"] != "ok"]
    if failed:
        print(f"[{tag}] not ok: {', '.join(failed)} (see their .log files in {out})")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
