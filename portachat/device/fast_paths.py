"""Vendor fast paths check themselves: the verdict record, its cache, and the check that makes it.

A fast path (an Ascend fused kernel, a decode graph, the CPU's own C kernels, oneDNN's packed weights,
compiled flex attention) is a candidate, never an assumption. The first time the device layer would
choose one on a device, and on `portachat doctor --selftest`, `verdict()` runs it once on small shapes
beside its portable reference on the same device (`check()`), and keeps it only if it runs and agrees
within the dtype's tolerance. A candidate that raises or disagrees is switched off; the reason is
printed once per process and shown by the doctor. Verdicts are cached per device name, candidate and
library versions in `<home>/fast_paths.json` (written atomically), like the calibrated peak FLOPs in
flops.py, so a new torch / torch_npu / CANN or a rebuilt kernel checks itself again.

Which candidates exist and what their references are is ops/selftest.py's (the references are
compute); this module holds no vendor call of its own.
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from portachat.device.dtypes import DTYPE_NAMES
from portachat.device.json_cache import merge_json_entry, read_json
from portachat.i18n import _
from portachat.storage.paths import portachat_home

# (rtol, atol) per compute dtype: what a different but correct kernel order may change. fp32 kernels
# differ by summation order only; bf16 has 8 mantissa bits (one rounding ~4e-3), fp16 has 11.
TOLERANCE: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (4e-2, 1e-2),
}


@dataclass(frozen=True)
class Verdict:
    name: str  # the candidate, e.g. "npu_rms_norm", "cpu_gemv"
    ok: bool
    reason: str  # what ran and how far it was from the reference, or the error it raised
    max_error: float | None = None  # largest |candidate - reference| - atol - rtol * |reference| (<= 0 passes)
    at: str = ""


Outputs = torch.Tensor | Sequence[torch.Tensor | None]


def _as_tensors(out: Outputs) -> list[torch.Tensor]:
    return [out] if isinstance(out, torch.Tensor) else list(out)


def compare(name: str, got: Outputs, want: Outputs, dtype: torch.dtype) -> Verdict:
    """Verdict of outputs `got` against the reference's `want`, within `dtype`'s tolerance."""
    rtol, atol = TOLERANCE.get(dtype, TOLERANCE[torch.float32])
    got_t, want_t = _as_tensors(got), _as_tensors(want)
    if len(got_t) != len(want_t):
        return Verdict(name, False, _("{name} returned {got} tensors, the reference {want}").format(
            name=name, got=len(got_t), want=len(want_t)))
    worst, worst_abs = -math.inf, 0.0
    for g, w in zip(got_t, want_t, strict=True):
        if g is None or w is None:  # e.g. a gradient one side computes and the other does not
            if g is w:
                continue
            return Verdict(name, False, _("{name} returned no tensor where the reference returned one (or the "
                                          "reverse), e.g. a missing gradient").format(name=name))
        if tuple(g.shape) != tuple(w.shape):
            return Verdict(name, False, _("{name} returned shape {got}, the reference {want}").format(
                name=name, got=tuple(g.shape), want=tuple(w.shape)))
        g64, w64 = g.detach().double().cpu(), w.detach().double().cpu()
        if not torch.isfinite(g64).all() and torch.isfinite(w64).all():
            return Verdict(name, False, _("{name} returned inf/nan where the reference is finite").format(name=name))
        diff = (g64 - w64).abs()
        excess = (diff - atol - rtol * w64.abs()).max().item() if diff.numel() else -atol
        worst, worst_abs = max(worst, excess), max(worst_abs, diff.max().item() if diff.numel() else 0.0)
    dtype_name = DTYPE_NAMES.get(dtype, str(dtype))
    if worst > 0:
        return Verdict(name, False, _("{name} disagrees with the portable path: max |difference| {diff:.3g} is beyond "
                                      "{dtype}'s tolerance (rtol {rtol:g}, atol {atol:g})").format(
            name=name, diff=worst_abs, dtype=dtype_name, rtol=rtol, atol=atol), worst)
    return Verdict(name, True, _("{name} agrees with the portable path within {dtype}'s tolerance (max |difference| "
                                 "{diff:.3g})").format(name=name, dtype=dtype_name, diff=worst_abs), worst)


def check(name: str, candidate: Callable[[], Outputs], reference: Callable[[], Outputs], dtype: torch.dtype) -> Verdict:
    """Run the reference, then the candidate, on the same inputs (the callables close over them) and compare.
    Any exception the candidate raises is a verdict, not an error: the portable path stays."""
    try:
        want = reference()
    except Exception as e:  # nothing to compare with (the device itself fails): keep the candidate off
        return Verdict(name, False, _("the portable path failed beside {name}: {error}: {message}").format(
            name=name, error=type(e).__name__, message=str(e).splitlines()[0] if str(e) else ""))
    try:
        got = candidate()
    except Exception as e:  # a vendor kernel may raise anything (RuntimeError, its own error types)
        return Verdict(name, False, raised(name, e))
    return compare(name, got, want, dtype)


def raised(name: str, error: Exception) -> str:
    """The reason a candidate is off when it raised: its error's type and first line."""
    return _("{name} raised {error}: {message}").format(
        name=name, error=type(error).__name__, message=str(error).splitlines()[0] if str(error) else "")


def library_versions() -> str:
    """The libraries a verdict holds for: torch with its CUDA / HIP build, and torch_npu where it is loaded
    (its version follows the CANN release it pairs with)."""
    parts = [f"torch {torch.__version__}"]
    hip = getattr(torch.version, "hip", None)
    cuda = getattr(torch.version, "cuda", None)
    if hip:
        parts.append(f"hip {hip}")
    elif cuda:
        parts.append(f"cuda {cuda}")
    npu = sys.modules.get("torch_npu")
    if npu is not None:
        parts.append(f"torch_npu {getattr(npu, '__version__', '?')}")
    return ", ".join(parts)


def verdict_key(device_name: str, name: str, build: str = "") -> str:
    return "|".join(p for p in (device_name, name, build, library_versions()) if p)


def verdicts_path() -> Path:
    return portachat_home() / "fast_paths.json"


def load_verdicts() -> dict:
    return read_json(verdicts_path())


_LOCK = threading.Lock()
_SEEN: dict[str, Verdict] = {}  # this process's verdicts: checked (or read) once, printed once


def save_verdict(key: str, verdict: Verdict) -> None:
    """Merge one verdict into the cache (locked and atomic: concurrent ranks keep each other's entries)."""
    try:
        merge_json_entry(verdicts_path(), key, asdict(verdict))
    except OSError:
        pass  # a read-only home only costs a check per process


def _cached(key: str, name: str) -> Verdict | None:
    entry = load_verdicts().get(key)
    if not isinstance(entry, dict) or not isinstance(entry.get("ok"), bool):
        return None
    err = entry.get("max_error")
    return Verdict(name, entry["ok"], str(entry.get("reason", "")), float(err) if isinstance(err, int | float) else None,
                   str(entry.get("at", "")))


def verdict(device_name: str, name: str, run_check: Callable[[], Verdict], build: str = "",
            fresh: bool = False) -> Verdict:  # fmt: skip
    """The candidate's verdict on this device: this process's, else the cached one, else `run_check()`'s
    (then cached). `fresh` (doctor --selftest) checks again whatever is cached. A candidate switched off
    is said once per process, on stderr, with the reason."""
    key = verdict_key(device_name, name, build)
    with _LOCK:
        v = None if fresh else (_SEEN.get(key) or _cached(key, name))
        if v is None:
            # autograd on whatever the caller's mode: a first use may sit inside an inference-mode forward,
            # and training kernels are checked with their backward
            with torch.inference_mode(False), torch.enable_grad():
                v = run_check()
            v = Verdict(v.name, v.ok, v.reason, v.max_error, datetime.now(timezone.utc).isoformat(timespec="seconds"))
            save_verdict(key, v)
        announce = key not in _SEEN or (fresh and _SEEN[key].ok != v.ok)
        _SEEN[key] = v
    if announce and not v.ok:
        print(_("[portachat] fast path {name} is off on {device}, the portable path runs instead: {reason} "
                "(`portachat doctor --selftest` checks it again)").format(name=name, device=device_name, reason=v.reason),
              file=sys.stderr)
    return v


def recorded_verdicts(device_name: str, names: Sequence[str]) -> dict[str, Verdict]:
    """The cached verdicts of `names` on this device for the libraries loaded now (what the doctor shows
    without checking again): candidate name -> verdict; a candidate never checked is absent."""
    versions, found = library_versions(), {}
    for key in load_verdicts():
        parts = key.split("|")
        if len(parts) >= 3 and parts[0] == device_name and parts[1] in names and parts[-1] == versions:
            v = _cached(key, parts[1])
            if v is not None:
                found[parts[1]] = v
    return found


def seen_verdicts() -> dict[str, Verdict]:
    """Every verdict this process has reached or read, by cache key (for the doctor's report)."""
    with _LOCK:
        return dict(_SEEN)


def forget() -> None:
    """Drop this process's verdicts (tests; the file cache stays)."""
    with _LOCK:
        _SEEN.clear()
