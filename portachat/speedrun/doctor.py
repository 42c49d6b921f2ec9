"""`portachat doctor`: what this machine has, what portachat will do on it and why, and what is broken.

Exit code 0 when healthy, 1 when a check fails with severity "error".
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
from typing import TextIO

import torch
import torch.distributed as dist

from portachat.device import (
    Device,
    DeviceError,
    destroy_distributed,
    dist_env,
    get_device,
    init_distributed,
)
from portachat.device.explain import diagnose
from portachat.device.fast_paths import Verdict, recorded_verdicts
from portachat.device.flops import cached_peak, save_calibration, table_peak
from portachat.device.health import Check, device_health, environment_checks, versions, visible_env
from portachat.device.inference import measure_host_to_device
from portachat.device.probe import probe
from portachat.engine.decode_graphs import GRAPH_CHECKS
from portachat.eval.sandbox import available_isolation
from portachat.i18n import N_, _, gettext
from portachat.i18n.width import display_width, ljust
from portachat.ops.fast_path import device_candidates
from portachat.ops.selftest import run_selftest
from portachat.storage import hubs

DECISIONS = ("dtype", "compile", "attention", "packed_attention", "collective", "fused_optimizer", "dist_timeout")


def _matmul_tflops(dev: Device) -> float:
    return dev.measure_matmul(budget_s=0.5) / 1e12  # quick sizes keep the CPU doctor run well under 5 s


def _peak_unknown(dev: Device) -> bool:
    return table_peak(dev.name, dev.dtype) is None and cached_peak(dev.calibration_name, dev.dtype) is None


def _h2d(dev: Device) -> tuple[float, str]:
    """Host-to-device copy bandwidth in GB/s (CPU: a host memcpy, so the number is comparable)."""

    gbps, kind = measure_host_to_device(dev)
    notes = {"memcpy": _("host memcpy (no accelerator)"), "pinned": _("pinned host memory"),
             "pageable": _("pageable host memory (pinning failed)")}
    return gbps, notes[kind]


def _allreduce(dev: Device) -> dict:
    env = init_distributed(dev, timeout_s=120)
    try:
        t = torch.ones(4 * 2**20, device=dev.torch_device)  # 16 MiB of fp32
        dist.all_reduce(t)
        dev.synchronize()
        start = time.perf_counter()
        dist.all_reduce(t)
        dev.synchronize()
        seconds = time.perf_counter() - start
    finally:
        destroy_distributed()
    expected = env.world_size * env.world_size  # ones, reduced twice
    ok = bool(torch.all(t == expected).item())
    return {
        "ok": ok,
        "world_size": env.world_size,
        "backend": dev.dist_backend,
        "ms": round(seconds * 1e3, 3),
        "algbw_gbps": round(t.numel() * 4 / seconds / 1e9, 3),
    }


def _probe_step(name: str, fn, checks: list[Check]):
    """Run one probe; `name` is the check's name (marked with N_, shown translated)."""
    try:
        return fn()
    except Exception as exc:  # a probe failing is a finding, not a crash

        d = diagnose(exc)
        fix = "; ".join(d.remedies[:2]) if d else None
        checks.append(Check(name, False, "error", f"{type(exc).__name__}: {exc}", fix))
        return None


def collect_report(calibrate: bool = False, selftest: bool = False) -> dict:
    """Everything doctor knows, as a JSON-able dict; `checks` lists findings, `ok` sums them up."""
    checks: list[Check] = []
    report: dict = {
        "ok": False,
        "versions": {"torch": torch.__version__},
        "device": None,
        "devices": [],
        "env": {},
        "decisions": {},
        "dist": None,
        "probes": {},
        "checks": [],
    }
    try:
        facts = probe(None)
    except DeviceError:
        facts = None
    try:
        dev = get_device()
        checks.append(Check(N_("configuration"), True, "info", _("device settings are valid")))
    except DeviceError as exc:
        dev = None
        fix = _("use one of the valid values the message names, or unset the setting to let portachat choose")
        checks.append(Check(N_("configuration"), False, "error", str(exc), fix))
        if facts is not None:  # still show what portachat would choose by itself
            try:
                report["decisions_if_unconfigured"] = _decisions(Device(facts))
            except DeviceError:
                pass
    if dev is not None:
        facts = dev.facts
    if facts is not None:
        report["versions"] = versions(facts)
        report["env"] = visible_env(facts)
        report["devices"] = device_health(facts)
        checks += environment_checks(facts, report["devices"])
    try:
        report["dist"] = vars(dist_env())
    except DeviceError as exc:
        checks.append(
            Check(N_("torchrun environment"), False, "error", str(exc), _("unset RANK/WORLD_SIZE or use torchrun"))
        )
    if dev is not None:
        report["device"] = dev.describe()
        report["decisions"] = _decisions(dev)
        checks += [
            Check(N_("decision"), False, "warning", w, _("unset the override to let portachat choose"))
            for w in dev.warnings
        ]
        probes: dict = {"dtype": dev.dtype_name}
        tflops = _probe_step(N_("matmul probe"), lambda: _matmul_tflops(dev), checks)
        probes["matmul_tflops"] = round(tflops, 4) if tflops is not None else None
        if tflops is not None:
            ok = tflops > 0 and math.isfinite(tflops)
            checks.append(
                Check(N_("matmul"), ok, "info" if ok else "error",
                      _("{tflops} TFLOPS in {dtype}").format(tflops=f"{tflops:.4f}", dtype=dev.dtype_name))
            )
        h2d = _probe_step(N_("host-to-device probe"), lambda: _h2d(dev), checks)
        probes["h2d_gbps"], probes["h2d_note"] = (round(h2d[0], 2), h2d[1]) if h2d else (None, None)
        if not calibrate and tflops and _peak_unknown(dev):
            save_calibration(dev.calibration_name, dev.dtype, tflops * 1e12, "measured")  # the probe just measured it
        peak = _probe_step(N_("peak FLOPs probe"), (lambda: dev.calibrate()) if calibrate else dev.peak_flops, checks)
        probes["peak_flops"] = {"value": peak.value, "source": peak.source} if peak else None
        probes["allreduce"] = None
        if report["dist"] and report["dist"]["world_size"] > 1:
            probes["allreduce"] = _probe_step(N_("all-reduce probe"), lambda: _allreduce(dev), checks)
            if probes["allreduce"] is not None:
                ar = probes["allreduce"]
                checks.append(
                    Check(
                        N_("all-reduce"),
                        ar["ok"],
                        "info" if ar["ok"] else "error",
                        _("{backend} over {n} ranks: {ms} ms").format(
                            backend=ar["backend"], n=ar["world_size"], ms=ar["ms"]),
                    )
                )
        report["probes"] = probes
        report["fast_paths"] = _fast_paths(dev, selftest, checks)
    report["hubs"] = _hubs(checks)
    report["sandbox"] = _sandbox(checks)
    report["checks"] = [c.to_dict() for c in checks]
    report["ok"] = not any(not c.ok and c.severity == "error" for c in checks)
    return report


def _hubs(checks: list[Check]) -> dict:
    """Which model hubs answer from here (a HEAD request each, in parallel, a few seconds at most) and
    what to set when the Hugging Face Hub does not. Never an error: working offline is a choice."""

    if hubs.is_offline():
        checks.append(Check("model hubs", True, "info", "HF_HUB_OFFLINE is set: no downloads, local files only"))
        return {"offline": True, "probes": [], "advice": []}
    probes = hubs.probe_hubs()
    advice = hubs.hub_advice(probes)
    reachable = [p.name for p in probes if p.reachable]
    message = f"reachable: {', '.join(reachable)}" if reachable else "no model hub is reachable"
    checks.append(Check("model hubs", not advice, "info" if not advice else "warning", message,
                        "; ".join(advice) or None))
    return {"offline": False, "probes": [p.to_dict() for p in probes], "advice": advice}


def _sandbox(checks: list[Check]) -> str:
    """Which isolation model-written code gets here (bubblewrap or none): a warning, not an error, as
    only `portachat eval humaneval` needs it."""
    try:
        kind = available_isolation()
    except RuntimeError as exc:  # e.g. no `nobody` user for a root evaluator to switch to
        checks.append(Check(N_("code sandbox"), False, "warning", str(exc), None))
        return "none"
    if kind == "bubblewrap":
        checks.append(Check(N_("code sandbox"), True, "info", _(
            "bubblewrap: model-written code runs in new user, mount, PID and network namespaces")))
    else:
        if shutil.which("bwrap") is None:
            fix = _("install bubblewrap: `apt-get install bubblewrap` (or `dnf install bubblewrap`)")
        else:
            fix = _("bubblewrap is installed but cannot create user namespaces here: allow unprivileged ones "
                    "(sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0; in a container, "
                    "its seccomp or AppArmor profile must allow them)")
        checks.append(Check(N_("code sandbox"), False, "warning", _(
            "none: no namespaces for model-written code here, so `portachat eval humaneval` refuses to run it "
            "unless given --allow-unsandboxed-code"), fix))
    return kind


def _fast_paths(dev: Device, selftest: bool, checks: list[Check]) -> list[dict]:
    """The fast paths this device would choose and their self-test verdicts: checked now with --selftest,
    else as cached (a path never checked yet is checked at its first use)."""
    names = device_candidates(dev)
    if selftest:
        verdicts = {v.name: v for v in run_selftest(dev, GRAPH_CHECKS)}
    else:
        verdicts = recorded_verdicts(dev.name, names)
    rows = []
    for name in names:
        v: Verdict | None = verdicts.get(name)
        state = "unchecked" if v is None else "on" if v.ok else "off"
        reason = v.reason if v else _("not checked yet: checked at its first use, or now by `portachat doctor "
                                      "--selftest`")
        rows.append({"name": name, "state": state, "reason": reason})
        if v is not None and not v.ok:
            checks.append(Check(N_("fast path"), False, "warning", f"{name}: {v.reason}",
                                _("the portable path runs instead (correct, slower); after a driver or library "
                                  "update run `portachat doctor --selftest` to check it again")))
    return rows


def _decisions(dev: Device) -> dict:
    return {
        name: {"value": dev.decisions[name].value, "reason": dev.decisions[name].reason} for name in DECISIONS
    }


def _gib(n: int | None) -> str:
    return f"{n / 2**30:.1f} GiB" if n else "?"


def format_report(report: dict) -> str:
    """Aligned plain text for a terminal, in the user's language (the JSON keeps English names)."""
    out: list[str] = []

    def section(title: str, rows: list[tuple[str, str]]) -> None:
        out.append(title)
        width = max((display_width(k) for k, _v in rows), default=0)
        out.extend(f"  {ljust(k, width)}  {v}" for k, v in rows)
        out.append("")

    section(_("Versions"), [(k, v) for k, v in report["versions"].items() if v])
    dev = report.get("device")
    rows = []
    if dev:
        rows.append((_("using"), _("{device} ({type}) of {count} visible").format(
            device=f"{dev['kind']}:{dev['index']}", type=dev["type"], count=dev["count"])))
    rows += [
        (
            str(d["index"]),
            f"{d['name']}  {_gib(d['total_memory'])}"
            + ("  " + _("health {health}").format(health=d["health"]) if d["health"] else ""),
        )
        for d in report["devices"]
    ]
    section(_("Devices"), rows or [(_("none"), _("no device could be set up"))])
    decisions = report["decisions"] or report.get("decisions_if_unconfigured", {})
    section(
        _("Decisions"),
        [(k, f"{str(v['value']):<22} {v['reason']}") for k, v in decisions.items()] or [("-", _("n/a"))],
    )
    sources = {"portachat": _("portachat's default"), "user": _("set by you"), "unset": _("unset")}
    runtime = [(e["name"], f"{e['value'] or '-':<26} {sources[e['source']]}: {e['reason']}")
               for e in (dev or {}).get("env_defaults", [])]
    if runtime:  # the vendor runtime's settings portachat sets unless you did (Ascend: allocator, HCCL timeouts)
        section(_("Runtime environment"), runtime)
    section(
        _("Environment"),
        sorted(report["env"].items()) or [("-", _("no device-visibility or toolkit variables set"))],
    )
    p = report["probes"]
    if p:
        rows = [
            (
                "matmul",
                f"{p['matmul_tflops']} TFLOPS ({p['dtype']})" if p["matmul_tflops"] is not None else _("failed"),
            ),
            (
                "host->device",
                f"{p['h2d_gbps']} GB/s, {p['h2d_note']}" if p["h2d_gbps"] is not None else _("failed"),
            ),
        ]
        if p.get("peak_flops"):
            rows.append(
                (_("peak FLOPs"), f"{p['peak_flops']['value'] / 1e12:.4g} TFLOPS ({p['peak_flops']['source']})")
            )
        ar = p.get("allreduce")
        rows.append(
            (
                "all-reduce",
                _("{verdict}, {ms} ms, {n} ranks").format(
                    verdict=_("ok") if ar["ok"] else _("WRONG RESULT"), ms=ar["ms"], n=ar["world_size"])
                if ar
                else _("skipped (single process; run under torchrun to test collectives)"),
            )
        )
        section(_("Probes"), rows)
    states = {"on": _("on"), "off": _("OFF"), "unchecked": _("unchecked")}
    if report.get("fast_paths"):
        section(_("Fast paths (self-tested)"),
                [(f["name"], f"{ljust(states[f['state']], 10)} {f['reason']}") for f in report["fast_paths"]])
    hub = report.get("hubs") or {}
    if hub.get("offline"):
        section(_("Model hubs"), [("offline", _("HF_HUB_OFFLINE is set: downloads use local files only"))])
    elif hub.get("probes"):
        section(_("Model hubs"), [(p["name"], f"{_('reachable') if p['reachable'] else _('NOT reachable')}  {p['url']}  "
                                   f"({p['detail']})") for p in hub["probes"]]
                + [(_("advice"), a) for a in hub["advice"]])
    out.append(_("Checks"))
    marks = {"ok": _("ok"), "error": _("FAIL"), "warning": _("warn")}
    for c in report["checks"]:
        mark = marks["ok"] if c["ok"] else marks["error" if c["severity"] == "error" else "warning"]
        out.append(f"  [{ljust(mark, 4)}] {gettext(c['name'])}: {c['message']}")
        if not c["ok"] and c["fix"]:
            out.append("         " + _("fix: {fix}").format(fix=c["fix"]))
    problems = sum(1 for c in report["checks"] if not c["ok"] and c["severity"] == "error")
    out += ["", _("Result: healthy") if report["ok"] else _("Result: {n} problem(s) found").format(n=problems)]
    return "\n".join(out)


def run_doctor(as_json: bool = False, calibrate: bool = False, stream: TextIO | None = None,
               selftest: bool = False) -> int:  # fmt: skip
    """Print the report (only rank 0 under torchrun); return 0 when healthy, 1 otherwise. `selftest` checks
    every fast path of the device again now (else the cached verdicts are shown)."""
    stream = stream or sys.stdout  # looked up per call, so redirected stdout is honoured
    report = collect_report(calibrate=calibrate, selftest=selftest)
    dist = report.get("dist") or {}
    if dist.get("rank", 0) == 0:
        stream.write(
            json.dumps(report, indent=2, default=str) + "\n" if as_json else format_report(report) + "\n"
        )
        stream.flush()
    return 0 if report["ok"] else 1
