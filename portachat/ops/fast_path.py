"""Whether a fast path runs here: a candidate of this device (device/fast_path_choice.py) whose self-test
passed (device/fast_paths.py). The call sites ask on every call, so the answer is kept per process and
device type after the first question, which runs the check if no verdict is cached."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import torch

from portachat.device.device import Device, device_holding
from portachat.device.errors import DeviceError
from portachat.device.fast_path_choice import candidates
from portachat.device.fast_paths import Verdict, raised, verdict
from portachat.device.npu_kernels import has_op

Check = Callable[[Device], Verdict]  # runs the candidate beside its reference on the device, small shapes
_ON: dict[tuple[str, str], bool] = {}
_LOCK = threading.RLock()


FAST_PATHS_ENV = "PORTACHAT_FAST_PATHS"  # 0: every fast path off, the portable path only (for comparisons)


def device_candidates(dev: Device) -> tuple[str, ...]:
    if os.environ.get(FAST_PATHS_ENV, "1").strip() == "0":
        return ()
    return candidates(dev.facts, has_op, dev.packed_attention, dev.attention_backend)


def _device_type(where: torch.device | str) -> str:
    return where.type if isinstance(where, torch.device) else torch.device(where).type


def enabled(name: str, where: torch.device | str, check: Check, build: Callable[[], str] | None = None) -> bool:
    """Whether candidate `name` runs for tensors on `where`: chosen for that device and proven on it.
    `build` names the candidate's build (e.g. the C kernels' library file), so a rebuilt one checks again."""
    key = (name, _device_type(where))  # no torch.device built on the hot path: the answer is one lookup
    on = _ON.get(key)
    if on is not None:
        return on
    with _LOCK:
        if key not in _ON:
            try:
                dev = device_holding(torch.device(where))
            except DeviceError:  # a bad setting is reported where the device is set up, not from inside an op
                dev = None
            ok = dev is not None and name in device_candidates(dev)
            if ok:
                ok = verdict(dev.name, name, lambda: check(dev), build() if build else "").ok
            _ON[key] = ok
        return _ON[key]


def enabled_in_trace(name: str, where: torch.device | str, check: Check, unknown: bool) -> bool:
    """enabled(), callable from code torch.compile traces: inside a trace no check can run, so the answer
    known so far counts, and `unknown` before there is one (the device's own choice for a path the trace
    has always used, off for one it never did)."""
    if torch.compiler.is_compiling():
        known = _ON.get((name, _device_type(where)))
        return unknown if known is None else known
    return enabled(name, where, check)


def failed_in_use(name: str, where: torch.device | str, error: Exception) -> None:
    """Candidate `name` passed its self-test but raised on real inputs: off from now on (this process and the
    verdict cache, until `doctor --selftest` checks it again), the reason said once. The caller then runs
    the portable path."""
    where = torch.device(where)
    reason = raised(name, error)
    with _LOCK:
        _ON[(name, where.type)] = False
    try:
        dev = device_holding(where)
    except DeviceError:
        return
    verdict(dev.name, name, lambda: Verdict(name, False, reason), fresh=True)


def set_enabled(name: str, device_type: str, on: bool | None) -> None:
    """Set (or with None forget) the answer for `name` on `device_type`: for `doctor --selftest`, which
    has just checked again, and for tests that route calls through a stand-in vendor module."""
    with _LOCK:
        if on is None:
            _ON.pop((name, device_type), None)
        else:
            _ON[(name, device_type)] = on


def forget_all() -> None:
    with _LOCK:
        _ON.clear()
