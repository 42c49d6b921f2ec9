"""Weight-only quantization policy: which kernel runs int8 / int4 weights on this device, and why.

The rule: a quantized model must not be slower than the unquantized one. Where no kernel that beats
unquantized decode is known (or wired), the answer is a clear error naming what to do, never a
silent dequantize-per-matmul fallback. Pure decisions from probed facts, so every vendor is testable
with a simulated ProbeResult (tests/device/device_sim.py).

Measured on the reference 2-core AVX512 EPYC (benchmarks/quantize.py, SmolLM2-135M, greedy batch-1
decode, 1 thread): int8 2.3x and int4 3.1x fp32's tokens/s (bf16 dense 1.4x), perplexity +0.7% and
+5.8%. ATen's `_weight_int8pack_mm` / `_weight_int4pack_mm_for_cpu` are vectorised only for bf16
activations (with fp32 activations they ran 4-10x slower than fp32 dense), so the CPU backend feeds
them bf16 and casts the output back. torchao's CPU int8 weight-only path dequantizes the whole
weight per call in eager mode (slower than fp32) and torchao 0.18 has no CPU int4 layout, so the CPU
backend is plain ATen.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from portachat.device.errors import DeviceError
from portachat.device.probe import ProbeResult
from portachat.i18n import _

QUANT_MODES = ("int8", "int4")
INT4_GROUP_SIZES = (128, 64, 32)  # largest first: fewer scales; the int4 kernels accept 32..256
DEFAULT_INT4_GROUP_SIZE = 32  # llama.cpp's Q4 block; SmolLM2-135M ppl: +6% at 32, +50% at 64
# ATen's CPU kernels have vectorised paths for these capabilities (torch.backends.cpu.get_cpu_capability()).
FAST_CPU_CAPABILITIES = ("AVX512", "AVX2")

BACKEND_ATEN_CPU = "aten-cpu"  # torch._weight_int8pack_mm / torch._weight_int4pack_mm_for_cpu
BACKEND_TORCHAO = "torchao"  # torchao.quantization.quantize_ (tinygemm int4, inductor-fused int8)
BACKENDS = (BACKEND_ATEN_CPU, BACKEND_TORCHAO)


@dataclass(frozen=True)
class QuantPlan:
    """How to quantize for one device: backend, activation dtype fed to the kernel, int4 group size."""

    mode: str
    backend: str
    activation_dtype: torch.dtype
    group_size: int | None  # int4 only
    reason: str
    warning: str | None = None


def normalize_mode(mode: str) -> str:
    key = str(mode).strip().lower()
    if key not in QUANT_MODES:
        raise DeviceError(
            _("--quantize {mode} is not valid; valid values: {valid} "
              "(or leave --quantize out to run unquantized weights).").format(
                mode=repr(mode), valid=", ".join(QUANT_MODES))
        )
    return key


def _no_kernel(kind: str, mode: str, why: str) -> DeviceError:
    return DeviceError(
        _("--quantize {mode} is not available on {kind}: {why}. Dequantizing per matmul would be slower than "
          "the unquantized model, so portachat refuses instead of falling back silently. Run without --quantize "
          "(the device's bf16/fp16 weights), or export a GGUF (`portachat export gguf --type q8_0`) for a "
          "runtime with kernels for this device.").format(mode=mode, kind=kind, why=why)
    )


def decide_quantization(
    facts: ProbeResult, mode: str, cpu_capability: str | None = None, compiles: bool = False
) -> QuantPlan:
    """The quantization plan for `mode` on the device described by `facts`; DeviceError if none.

    `cpu_capability` is torch's SIMD level on CPU ("AVX512", "AVX2", "DEFAULT", ...); `compiles` says
    whether the model runs under inductor (int8 on CUDA is fast only when inductor fuses the dequant).
    """
    mode = normalize_mode(mode)
    kind = facts.kind
    if kind == "cpu":
        cap = cpu_capability or "unknown"
        warning = None
        if cap not in FAST_CPU_CAPABILITIES:
            warning = (
                _("CPU capability {cap}: the ATen weight-only kernels were measured only on AVX2/AVX512 x86; "
                  "check `python benchmarks/quantize.py` before relying on the speed").format(cap=cap)
            )
        kernel = "_weight_int8pack_mm" if mode == "int8" else "_weight_int4pack_mm_for_cpu"
        return QuantPlan(
            mode=mode,
            backend=BACKEND_ATEN_CPU,
            activation_dtype=torch.bfloat16,
            group_size=DEFAULT_INT4_GROUP_SIZE if mode == "int4" else None,
            reason=(
                _("CPU ({cap}): ATen torch.{kernel} with bf16 activations (vectorised there; batch-1 decode "
                  "measured faster than fp32 dense; torchao's CPU path dequantizes per call)").format(
                    cap=cap, kernel=kernel)
            ),
            warning=warning,
        )
    if kind in ("cuda", "rocm"):
        cap = facts.capability or (0, 0)
        if kind == "cuda" and cap < (8, 0):
            raise _no_kernel(kind, mode, _("compute capability {major}.{minor} < 8.0 (tinygemm needs bf16)").format(
                major=cap[0], minor=cap[1]))
        if kind == "rocm" and not (facts.gcn_arch or "").startswith(("gfx90a", "gfx94", "gfx95")):
            raise _no_kernel(kind, mode, _("{arch}: torchao's int4/int8 kernels target CDNA2+ only").format(
                arch=facts.gcn_arch))
        if mode == "int4":
            return QuantPlan(
                mode=mode,
                backend=BACKEND_TORCHAO,
                activation_dtype=torch.bfloat16,
                group_size=128,
                reason=_("{kind}: torchao Int4WeightOnlyConfig, tinygemm tile-packed kernel, bf16 activations").format(
                    kind=kind),
            )
        if not compiles:
            raise _no_kernel(
                kind,
                mode,
                _("torchao's int8 weight-only linear is fast only when inductor fuses the dequantization into "
                  "the matmul, and this run is eager (set PORTACHAT_COMPILE=1, or use --quantize int4)"),
            )
        return QuantPlan(
            mode=mode,
            backend=BACKEND_TORCHAO,
            activation_dtype=torch.bfloat16,
            group_size=None,
            reason=_("{kind}: torchao Int8WeightOnlyConfig (per-channel), dequant fused into the matmul by inductor").format(
                kind=kind),
        )
    reasons = {
        "dcu": _("Hygon DCU (DTK) builds ship no weight-only int8/int4 matmul kernel in torch or torchao"),
        "npu": _("torch_npu's npu_weight_quant_batchmatmul is not wired into portachat yet"),
        "xpu": _("no XPU weight-only kernel is wired into portachat yet"),
        "mps": _("no MPS weight-only kernel is wired into portachat yet"),
    }
    raise _no_kernel(kind, mode, reasons.get(kind) or _("unknown device kind {kind}").format(kind=repr(kind)))


def quantization_plan(device, mode: str, compiled: bool | None = None) -> QuantPlan:
    """The plan for a live `portachat.device.Device` (reads the CPU's SIMD level from torch).

    `compiled` says whether the caller runs the model under torch.compile (default: the device's
    compile decision); pass False when it runs eagerly whatever the device would allow.
    """
    cap = torch.backends.cpu.get_cpu_capability() if device.type == "cpu" else None
    compiles = bool(device.compile) if compiled is None else compiled
    return decide_quantization(device.facts, mode, cpu_capability=cap, compiles=compiles)
