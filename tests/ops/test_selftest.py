"""The CPU's own fast paths go through the self-test for real: the C kernels and the packed weights are
checked beside PyTorch before first use, kept when they agree, and switched off (PyTorch runs) when not."""

from __future__ import annotations

import pytest
import torch

from portachat.device import fast_paths
from portachat.device.device import get_device
from portachat.ops import cpu_kernels, cpu_linear, fast_path
from portachat.ops.selftest import run_selftest
from tests.fakes import forget_fast_path_answers


@pytest.fixture(autouse=True)
def _fresh():
    """Each test starts as a new process would: no verdict in memory, the kernels not loaded yet."""
    forget_fast_path_answers()
    cpu_kernels.library.cache_clear()
    yield
    forget_fast_path_answers()
    cpu_kernels.library.cache_clear()


def _kernels_build() -> bool:
    try:
        cpu_kernels.load(cpu_kernels.build())
    except (OSError, RuntimeError):
        return False
    return True


def test_doctor_selftest_checks_every_cpu_fast_path_and_they_agree():
    dev = get_device("cpu")
    verdicts = {v.name: v for v in run_selftest(dev)}
    assert set(verdicts) == {"cpu_kernels", "cpu_packed_linear"}
    if _kernels_build():
        assert verdicts["cpu_kernels"].ok, verdicts["cpu_kernels"].reason
    if cpu_linear._packing_built(torch.float32) or cpu_linear._packing_built(torch.bfloat16):
        assert verdicts["cpu_packed_linear"].ok, verdicts["cpu_packed_linear"].reason
    recorded = fast_paths.recorded_verdicts(dev.name, ("cpu_kernels", "cpu_packed_linear"))
    assert {n: v.ok for n, v in recorded.items()} == {n: v.ok for n, v in verdicts.items()}


def test_c_kernels_that_disagree_are_not_used_and_pytorch_runs(monkeypatch, capsys):
    if not _kernels_build():
        pytest.skip("no C compiler here: the kernels are off anyway")
    real = cpu_kernels.SmallBatchLinear.__call__

    def off_by_one_percent(self, x, *a, **k):
        return real(self, x, *a, **k) * 1.01

    monkeypatch.setattr(cpu_kernels.SmallBatchLinear, "__call__", off_by_one_percent)
    assert cpu_kernels.library() is None
    assert not cpu_linear.kernels_available("cpu")
    assert "fast path cpu_kernels is off" in capsys.readouterr().err
    w = torch.randn(32, 64)
    product = cpu_linear.pack_linear(w)
    x = torch.randn(1, 64)
    if product is not None:  # MKL's product (or the plain one) rather than the kernel's
        torch.testing.assert_close(product(x), x @ w.T, rtol=1e-5, atol=1e-5)


def test_c_kernels_that_agree_are_used_and_checked_once(monkeypatch):
    if not _kernels_build():
        pytest.skip("no C compiler here")
    calls = []
    real = cpu_kernels.check_library
    monkeypatch.setattr(cpu_kernels, "check_library", lambda lib: calls.append(1) or real(lib))
    assert cpu_kernels.library() is not None
    cpu_kernels.library.cache_clear()
    fast_paths.forget()
    fast_path.forget_all()
    assert cpu_kernels.library() is not None  # a later process: the cached verdict, no second check
    assert calls == [1]


def test_packed_weights_that_disagree_fall_back_to_the_plain_product(monkeypatch):
    if not (cpu_linear._packing_built(torch.float32) or cpu_linear._packing_built(torch.bfloat16)):
        pytest.skip("this torch packs no weights here")
    real = cpu_linear._packed

    def without_bias(weight, bias, in_scale, batch_hint):
        return real(weight, None, in_scale, batch_hint)

    monkeypatch.setattr(cpu_linear, "_packed", without_bias)
    assert not cpu_linear.packing_available("cpu", torch.float32)
    assert not cpu_linear.packing_available("cpu", torch.bfloat16)
    assert not cpu_linear.holds_packed_copy("cpu", torch.float32)


def test_inside_a_compile_trace_no_check_runs_and_the_known_answer_counts(monkeypatch):
    ran = []

    def check(dev):
        ran.append(dev)
        return fast_paths.Verdict("x", True, "agrees")

    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert fast_path.enabled_in_trace("flex_attention", "cpu", check, True) is True  # the device's choice stands
    assert fast_path.enabled_in_trace("npu_rms_norm", "cpu", check, False) is False  # a path never traced stays off
    fast_path.set_enabled("flex_attention", "cpu", False)  # an earlier eager check failed here
    assert fast_path.enabled_in_trace("flex_attention", "cpu", check, True) is False
    assert ran == []
