"""The verdict record: compare within the dtype's tolerance, a raising candidate is a verdict, the cache is
per device name, candidate, build and library versions, and a path switched off is said once."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from portachat.device import fast_paths
from portachat.device.fast_paths import Verdict, check, compare, recorded_verdicts, verdict


@pytest.fixture(autouse=True)
def _fresh_process_verdicts():
    fast_paths.forget()
    yield
    fast_paths.forget()


def test_agreement_within_the_dtype_tolerance_passes_and_beyond_it_fails():
    want = torch.linspace(-4, 4, 64)
    assert compare("k", want + 1e-6, want, torch.float32).ok
    assert not compare("k", want + 1e-3, want, torch.float32).ok
    # bf16 rounds to 8 mantissa bits: one rounding passes at bf16's tolerance, not at fp32's
    rounded = want.bfloat16().float()
    assert compare("k", rounded, want, torch.bfloat16).ok
    assert not compare("k", rounded * 1.1, want, torch.bfloat16).ok


def test_wrong_shape_count_and_nan_are_disagreements():
    want = torch.ones(3, 4)
    assert "shape" in compare("k", torch.ones(4, 3), want, torch.float32).reason
    assert "tensors" in compare("k", [want, want], [want], torch.float32).reason
    assert "nan" in compare("k", torch.full((3, 4), float("nan")), want, torch.float32).reason


def test_a_candidate_that_raises_is_switched_off_with_its_error():
    def crash():
        raise RuntimeError("EZ9999 kernel not supported\nstack...")

    v = check("fused", crash, lambda: torch.ones(2), torch.float32)
    assert not v.ok and "RuntimeError" in v.reason and "EZ9999 kernel not supported" in v.reason
    assert "stack" not in v.reason


def test_a_verdict_is_checked_once_cached_and_reread(capsys):
    runs = []

    def run_check():
        runs.append(1)
        return Verdict("k", False, "disagrees by 3")

    assert not verdict("Dev X", "k", run_check).ok
    assert not verdict("Dev X", "k", run_check).ok
    assert len(runs) == 1
    err = capsys.readouterr().err
    assert err.count("fast path k is off on Dev X") == 1 and "disagrees by 3" in err
    fast_paths.forget()  # a new process reads the file, prints again, and does not check again
    assert not verdict("Dev X", "k", run_check).ok and len(runs) == 1
    assert "fast path k is off" in capsys.readouterr().err
    data = json.loads(fast_paths.verdicts_path().read_text())
    (key,) = data
    assert key.startswith("Dev X|k|torch ") and data[key]["ok"] is False and data[key]["at"]


def test_another_device_build_or_library_version_checks_again(monkeypatch):
    runs = []

    def run_check():
        runs.append(1)
        return Verdict("k", True, "agrees")

    verdict("Dev X", "k", run_check)
    verdict("Dev Y", "k", run_check)
    verdict("Dev X", "k", run_check, build="lib-abc.so")
    assert len(runs) == 3
    fake = type(sys)("torch_npu")
    fake.__version__ = "2.9.0.post1"
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    verdict("Dev X", "k", run_check)
    assert len(runs) == 4 and "torch_npu 2.9.0.post1" in fast_paths.library_versions()


def test_fresh_checks_again_and_recorded_verdicts_show_the_current_ones():
    verdict("Dev X", "k", lambda: Verdict("k", False, "bad"))
    verdict("Dev X", "other", lambda: Verdict("other", True, "good"))
    assert verdict("Dev X", "k", lambda: Verdict("k", True, "good now"), fresh=True).ok
    shown = recorded_verdicts("Dev X", ("k", "other", "never"))
    assert {n: v.ok for n, v in shown.items()} == {"k": True, "other": True}
    assert recorded_verdicts("Dev Y", ("k",)) == {}


def test_a_corrupt_cache_is_ignored(tmp_path):
    fast_paths.verdicts_path().parent.mkdir(parents=True, exist_ok=True)
    fast_paths.verdicts_path().write_text("{not json")
    assert verdict("Dev X", "k", lambda: Verdict("k", True, "agrees")).ok
    assert json.loads(fast_paths.verdicts_path().read_text())  # rewritten whole
