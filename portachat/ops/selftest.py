"""`portachat doctor --selftest`: every fast path this device would choose, checked again now.

The same checks run on their own the first time a fast path would be used (ops/fast_path.enabled);
this runs them all at once, ignoring cached verdicts, and records the fresh ones (the cache and this
process's answers), so a path that fails here is off from now on and one that passes is back on.
"""

from __future__ import annotations

from collections.abc import Mapping

from portachat.device.device import Device
from portachat.device.fast_paths import Verdict, verdict
from portachat.device.fused_adamw import check_fused_adamw
from portachat.i18n import _
from portachat.ops import cpu_kernels, cpu_linear, fast_ops, npu_attention, paged_attention
from portachat.ops.attention import check_flex, check_npu_fusion
from portachat.ops.fast_path import Check, device_candidates, set_enabled

CHECKS: dict[str, Check] = {
    "npu_rms_norm": fast_ops.check_rms_norm,
    "npu_rotary_mul": fast_ops.check_rotary,
    "npu_swiglu": fast_ops.check_swiglu,
    "npu_top_k_top_p": fast_ops.check_top_k_top_p,
    "npu_fused_infer_attention_score": paged_attention.check_fused_infer_attention,
    "npu_paged_attention": npu_attention.check_paged_attention,
    "npu_reshape_and_cache": npu_attention.check_reshape_and_cache,
    "cpu_packed_linear": cpu_linear.check_packing,
    "flex_attention": check_flex,
    "npu_fusion_attention": check_npu_fusion,
    "fused_adamw": check_fused_adamw,
}


def _check_cpu_kernels(_dev: Device) -> Verdict:
    try:
        lib = cpu_kernels.load(cpu_kernels.build())
    except (OSError, RuntimeError) as e:
        return Verdict("cpu_kernels", False, str(e))
    return cpu_kernels.check_library(lib)


CHECKS["cpu_kernels"] = _check_cpu_kernels


def _build(name: str) -> str:
    # the C kernels' verdict is per build, as ops/cpu_kernels.library() records it
    return cpu_kernels.library_path().name if name == "cpu_kernels" else ""


def run_selftest(dev: Device, extra: Mapping[str, Check] | None = None) -> list[Verdict]:
    """Fresh verdicts of this device's candidates (`extra`: checks of floors above ops, e.g. the engine's
    decode graphs); a candidate without a check here is reported as not checked, and stays off."""
    checks = {**CHECKS, **(extra or {})}
    results = []
    for name in device_candidates(dev):
        fn = checks.get(name)
        if fn is None:
            results.append(Verdict(name, False, _("no self-test for this fast path in this build: it stays off")))
            continue
        v = verdict(dev.name, name, lambda fn=fn: fn(dev), _build(name), fresh=True)
        set_enabled(name, dev.type, v.ok)
        results.append(v)
    return results
