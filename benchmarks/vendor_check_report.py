"""summary.json and summary.md for benchmarks/npu_check.sh and dcu_check.sh, from status.tsv and each part's log.

    python benchmarks/vendor_check_report.py OUT_DIR --kind npu|dcu

Each part keeps its status (ok / failed / timeout), seconds and budget, and the figures its log holds (read
with gpu_check_report.py's parsers); on top: the fast-path verdicts the doctor's self-test reached, training
with the fast paths against the portable path (tok/s and MFU), the measured training peak against the
estimate, and decode against transformers per batch size.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gpu_check_report as gpu

PARTS = ("doctor", "train_fast", "train_portable", "train_base", "estimate", "decode")


def parse_part(name: str, text: str, out: Path, kind: str) -> dict:
    if name == "doctor":
        d = gpu.whole_json(text) or {}
        return {**gpu.doctor(text, out), "fast_paths": d.get("fast_paths")}
    if name in ("train_fast", "train_portable"):
        return gpu.train_throughput(text, out)
    if name == "train_base":
        return gpu.train_base(text, out, run=f"{kind}_check")
    return getattr(gpu, name)(text, out)


def summarize(out: Path, kind: str) -> dict:
    parts = gpu.read_parts(out, PARTS, lambda name, text: parse_part(name, text, out, kind))
    fast, portable = parts["train_fast"]["result"], parts["train_portable"]["result"]
    speedup = (fast["ours_tok_s"] / portable["ours_tok_s"]
               if fast.get("ours_tok_s") and portable.get("ours_tok_s") else None)  # fmt: skip
    measured = parts["train_base"]["result"].get("peak_memory_bytes")
    estimated = parts["estimate"]["result"].get("training_peak_bytes")
    return {
        "kind": kind, "device": parts["doctor"]["result"].get("device"), "parts": parts,
        "fast_paths": parts["doctor"]["result"].get("fast_paths"),
        "training": {"fast_tok_s": fast.get("ours_tok_s"), "fast_mfu": fast.get("ours_mfu"),
                     "portable_tok_s": portable.get("ours_tok_s"), "portable_mfu": portable.get("ours_mfu"),
                     "fast_over_portable": speedup, "loader_wait_s": parts["train_base"]["result"].get("loader_wait_s")},
        "memory": {"train_peak_bytes": measured, "estimated_peak_bytes": estimated,
                   "measured_over_estimate": measured / estimated if measured and estimated else None},
        "decode": parts["decode"]["result"].get("by_batch"),
        "total_seconds": sum(p["seconds"] or 0 for p in parts.values()),
    }  # fmt: skip


def markdown(s: dict) -> str:
    lines = [f"# {s['kind'].upper()} check on {s['device'] or 'unknown device'}", "", f"Total {s['total_seconds']} s.",
             "", "| part | status | seconds / budget |", "|---|---|---|"]
    lines += [f"| {n} | {p['status']} | {p['seconds']} / {p['budget_s']} |" for n, p in s["parts"].items()]
    lines += ["", "## Fast paths (doctor --selftest)", ""]
    lines += [f"- {f['name']}: {f['state']} ({f['reason']})" for f in s["fast_paths"] or []] or ["- none reported"]
    t = s["training"]
    lines += ["", "## Training, depth 12", "", f"- fast paths: {t['fast_tok_s']} tok/s, MFU {t['fast_mfu']}",
              f"- portable path: {t['portable_tok_s']} tok/s, MFU {t['portable_mfu']}",
              f"- fast / portable: {t['fast_over_portable']}", f"- loader waits (s): {t['loader_wait_s']}"]
    m = s["memory"]
    lines += ["", "## Training memory", "", f"peak {m['train_peak_bytes']} bytes over ten steps, estimate "
              f"{m['estimated_peak_bytes']} bytes, ratio {m['measured_over_estimate']}"]
    lines += ["", "## Decode vs transformers", ""]
    lines += [f"- batch {b}: ours {r['ours_tok_s']} tok/s, transformers {r['hf_tok_s']} tok/s, ratio {r['ratio']}"
              for b, r in (s["decode"] or {}).items()] or ["- not measured"]
    lines += ["", "Details per part: the .log files beside this summary."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="the directory npu_check.sh / dcu_check.sh wrote")
    p.add_argument("--kind", choices=("npu", "dcu"), required=True)
    args = p.parse_args(argv)
    summary = summarize(args.out, args.kind)
    code = gpu.write_summary(args.out, summary, markdown(summary), f"{args.kind}_check")
    print(f"[{args.kind}_check] please share {args.out / 'summary.md'} (see the README)")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
