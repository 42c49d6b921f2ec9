"""benchmarks/npu_check.sh and dcu_check.sh: --dry-run prints the whole plan without hardware (every command
parses with the parser it goes to, the budgets fit 10 minutes), and the report turns the parts' logs into
summary.json / summary.md."""

from __future__ import annotations

import importlib.util
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from portachat.cli import build_parser
from tests.conftest import REPO

PARTS = ("doctor", "train_fast", "train_portable", "train_base", "estimate", "decode")


def _plan(kind: str, tmp_path) -> list[tuple[str, int, list[str]]]:
    out = tmp_path / "never-written"
    proc = subprocess.run(["bash", f"benchmarks/{kind}_check.sh", "--dry-run", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert not out.exists()  # a dry run writes nothing
    parts = []
    for line in proc.stdout.splitlines():
        head, sep, command = line.partition("s): ")
        if sep and "(at most " in head:
            name, budget = head.removeprefix(f"[{kind}_check] ").split(" (at most ")
            parts.append((name, int(budget), shlex.split(command)))
    assert "share" in proc.stdout and "summary.md" in proc.stdout
    return parts


def _script_parser(path: str):
    name = f"plan_{Path(path).stem}"
    spec = importlib.util.spec_from_file_location(name, REPO / path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.parse_args


@pytest.mark.parametrize("kind", ["npu", "dcu"])
def test_dry_run_prints_a_plan_whose_commands_parse(kind, tmp_path):
    parts = _plan(kind, tmp_path)
    assert [p[0] for p in parts] == list(PARTS)
    assert sum(p[1] for p in parts) <= 600 - 15  # 10 minutes with the report
    for name, _budget, argv in parts:
        if argv[0] == "env":  # env VAR=VALUE python ...
            argv = argv[2:]
        if argv[1:3] == ["-m", "portachat"]:
            args = build_parser().parse_args(argv[3:])
            if args.command == "train":
                assert args.device == kind and args.depth == 12
        else:
            args = _script_parser(argv[1])(argv[2:])
            assert args.device == kind and args.depth == 12, name
    fast, portable = parts[1][2], parts[2][2]
    assert fast[1] == "PORTACHAT_FAST_PATHS=1" and portable[1] == "PORTACHAT_FAST_PATHS=0" and fast[2:] == portable[2:]
    assert "--selftest" in parts[0][2]
    assert _script_parser("benchmarks/decode.py")(parts[5][2][2:]).batch_sizes == [1, 8, 32]


def test_the_kind_and_options_are_checked(tmp_path):
    bad = subprocess.run(["bash", "benchmarks/vendor_check.sh", "cuda"], cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and "npu or dcu" in bad.stderr
    bad = subprocess.run(["bash", "benchmarks/npu_check.sh", "--dryrun"], cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and "--dry-run" in bad.stderr


def _line(record: dict) -> str:
    return "some progress output\n" + json.dumps(record) + "\n"


def test_the_report_compares_fast_and_portable_and_memory_and_decode(tmp_path):
    out = tmp_path / "out"
    (out / "runs/npu_check/base").mkdir(parents=True)
    rows = [{"step": i, "loss": 5.0, "dt_s": 0.5, "tok_per_s": 30000.0 + i, "mem_bytes": 20_000_000_000 + i,
             "loader_wait_s": 0.001 * i, "mfu": 0.31} for i in range(10)]  # fmt: skip
    (out / "runs/npu_check/base/log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    doctor = {"ok": True, "device": {"name": "Ascend910B3", "kind": "npu", "dtype": "bf16"},
              "fast_paths": [{"name": "npu_rms_norm", "state": "on", "reason": "agrees"},
                             {"name": "npu_swiglu", "state": "off", "reason": "disagrees"}]}  # fmt: skip
    logs = {
        "doctor": json.dumps(doctor, indent=2),
        "train_fast": _line({"results": {"portachat": {"tok_per_s": 36000.0, "mfu": 0.36}, "reference": {"tok_per_s": 30000.0}}, "ratio": 1.2}),
        "train_portable": _line({"results": {"portachat": {"tok_per_s": 30000.0, "mfu": 0.30}, "reference": {"tok_per_s": 30000.0}}, "ratio": 1.0}),
        "train_base": "ten steps\n",
        "estimate": json.dumps({"training": {"peak_bytes": 16_000_000_000, "peak_phase": "backward"}}, indent=2),
        "decode": _line({"dtype": "bf16", "results": [{"batch": b, "ours_tok_s": 100.0 * b, "hf_tok_s": 20.0 * b,
                                                       "ratio": 5.0} for b in (1, 8, 32)]}),
    }  # fmt: skip
    for name, text in logs.items():
        (out / f"{name}.log").write_text(text)
    (out / "status.tsv").write_text("".join(f"{n}\tok\t0\t10\t100\n" for n in PARTS[:-1]) + "decode\ttimeout\t124\t150\t150\n")
    proc = subprocess.run([sys.executable, "benchmarks/vendor_check_report.py", str(out), "--kind", "npu"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 1 and "not ok: decode" in proc.stdout  # a part that timed out is a finding
    s = json.loads((out / "summary.json").read_text())
    assert s["device"] == "Ascend910B3" and s["training"]["fast_over_portable"] == pytest.approx(1.2)
    assert s["training"]["fast_mfu"] == 0.36 and s["training"]["loader_wait_s"][:2] == [0.0, 0.001]
    assert s["memory"]["measured_over_estimate"] == pytest.approx(20_000_000_009 / 16_000_000_000)
    assert set(s["decode"]) == {"1", "8", "32"} and s["parts"]["decode"]["status"] == "timeout"
    md = (out / "summary.md").read_text()
    assert "npu_swiglu: off (disagrees)" in md and "fast / portable: 1.2" in md and "batch 32" in md
