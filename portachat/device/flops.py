"""Peak FLOP/s per device and dtype, for MFU: a table of published dense figures, else a measurement.

Table values are dense (no sparsity) tensor-core figures for bf16/fp16. fp32 is the figure a plain
fp32 matmul can reach (CUDA cores on NVIDIA, i.e. no TF32; matrix cores on AMD Instinct).
CPUs get cores x FLOP/cycle of the dtype that runs (AMX, AVX512-BF16, Arm BF16, else the fp32 FMA
rate) x clock. Anything else is measured by `portachat doctor --calibrate` (large matmuls, best of
several, cached in `<home>/calibration.json`); until then MFU shows "n/a (run portachat doctor
--calibrate)" rather than a figure from a short or busy measurement. A calibrated rate above the
table or spec figure replaces it: a peak is a ceiling, and a sustained rate proves it is higher.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from portachat.device.dtypes import DTYPE_NAMES
from portachat.device.json_cache import merge_json_entry, read_json
from portachat.storage.paths import portachat_home

T = 1e12


@dataclass
class PeakFlops:
    value: float  # FLOP/s
    source: str  # "table" | "cpu spec, <ISA>" | "calibrated" | "uncalibrated" (value nan: MFU shows n/a), or
    # "calibrated (above the ... figure)" / "measured in this run (above ...)" when a sustained rate beat it


@dataclass(frozen=True)
class PeakEntry:
    pattern: str  # regex searched in the device name (case-insensitive); most specific first
    bf16: float | None
    fp16: float | None
    fp32: float | None


# Order matters: the first pattern that matches the device name wins.
PEAK_TABLE: tuple[PeakEntry, ...] = (
    # NVIDIA
    PeakEntry(r"GH200", 989 * T, 989 * T, 67 * T),
    PeakEntry(r"H200", 989 * T, 989 * T, 67 * T),
    PeakEntry(r"H100.*PCIe", 756 * T, 756 * T, 51 * T),
    PeakEntry(r"H100.*NVL", 835 * T, 835 * T, 60 * T),
    PeakEntry(r"H100", 989 * T, 989 * T, 67 * T),  # SXM ("NVIDIA H100 80GB HBM3")
    PeakEntry(r"H800.*PCIe", 756 * T, 756 * T, 51 * T),
    PeakEntry(r"H800", 989 * T, 989 * T, 67 * T),
    PeakEntry(r"H20\b", 148 * T, 148 * T, 44 * T),
    PeakEntry(r"B200", 2250 * T, 2250 * T, None),
    PeakEntry(r"A100|A800", 312 * T, 312 * T, 19.5 * T),
    PeakEntry(r"A10G", 70 * T, 70 * T, 31.2 * T),
    PeakEntry(r"A10\b", 125 * T, 125 * T, 31.2 * T),
    PeakEntry(r"L40S", 362 * T, 362 * T, 91.6 * T),
    PeakEntry(r"L40\b", 181 * T, 181 * T, 90.5 * T),
    PeakEntry(r"\bL4\b", 121 * T, 121 * T, 30.3 * T),
    PeakEntry(r"RTX 4090", 165.2 * T, 165.2 * T, 82.6 * T),
    PeakEntry(r"V100", None, 125 * T, 15.7 * T),
    PeakEntry(r"\bT4\b", None, 65 * T, 8.1 * T),
    # AMD Instinct
    PeakEntry(r"MI355X", 2516 * T, 2516 * T, 157.3 * T),
    PeakEntry(r"MI325X|MI300X", 1307.4 * T, 1307.4 * T, 163.4 * T),
    PeakEntry(r"MI300A", 980.6 * T, 980.6 * T, 122.6 * T),
    PeakEntry(r"MI250X", 383 * T, 383 * T, 95.7 * T),
    PeakEntry(r"MI250", 362.1 * T, 362.1 * T, 90.5 * T),
    PeakEntry(r"MI210", 181 * T, 181 * T, 45.3 * T),
    PeakEntry(r"MI100", 92.3 * T, 184.6 * T, 46.1 * T),
    # Huawei Ascend (commonly quoted vendor figures; fp32 left to measurement)
    PeakEntry(r"910B1", 414 * T, 414 * T, None),
    PeakEntry(r"910B2", 376 * T, 376 * T, None),
    PeakEntry(r"910B3", 313 * T, 313 * T, None),
    PeakEntry(r"910B4", 280 * T, 280 * T, None),
    PeakEntry(r"910_93|910C", 376 * T, 376 * T, None),  # per die, as torch_npu exposes one device per die
    PeakEntry(r"910B", 313 * T, 313 * T, None),  # "Ascend910B" without its bin: the Atlas 800T A2 figure
    PeakEntry(r"910(A|Pro|Premium)|Ascend910$", None, 256 * T, None),
    PeakEntry(r"310P", None, 70 * T, None),  # Atlas 300I Pro (one 310P3): an inference card, fp16 only
    # Hygon DCU (vendor-quoted; `doctor --calibrate` replaces a figure its measurement beats)
    PeakEntry(r"K100[_ -]?AI", 192 * T, 192 * T, None),
)


# Arm cores by /proc/cpuinfo "implementer:part": fp32 FLOP per cycle per core = 128-bit FMA pipes x 4 lanes
# x 2, from Arm's Software Optimization Guides (SVE's wider vectors run on the same datapath). Arm exposes
# no vector-unit count in its flags, so an unknown part gets no spec (doctor --calibrate measures it).
ARM_FP32_PER_CYCLE: dict[str, tuple[str, int]] = {
    "0x41:0xd0c": ("Neoverse N1", 16),  # Graviton2, Ampere Altra: 2 pipes
    "0x41:0xd40": ("Neoverse V1", 32),  # Graviton3: 4 pipes (2 x 256-bit SVE)
    "0x41:0xd49": ("Neoverse N2", 16),  # Azure Cobalt 100: 2 pipes
    "0x41:0xd4f": ("Neoverse V2", 32),  # Graviton4, NVIDIA Grace: 4 pipes
}


@dataclass(frozen=True)
class CpuRate:
    per_cycle: float  # FLOP per cycle per core
    isa: str  # the instructions that reach it, for the peak's source line


def cpu_fp32_rate(flags: tuple[str, ...], vendor: str | None, family: int | None, part: str | None) -> CpuRate | None:
    """fp32 FLOP/cycle/core: vector lanes x 2 (FMA) x FMA units, for cores whose vector units are known.

    FMA units per core are not in the flags: Intel cores with AVX-512 and AMD Zen 5 (family 26) have two
    512-bit pipes; AMD Zen 4 (family 25) runs AVX-512 on two 256-bit pipes (one 512-bit op per cycle);
    AVX2-only cores have two 256-bit pipes. Arm cores come from ARM_FP32_PER_CYCLE.
    """
    if vendor in ("GenuineIntel", "AuthenticAMD"):
        if "avx512f" in flags:
            units = 1 if vendor == "AuthenticAMD" and (family or 0) < 26 else 2
            return CpuRate(16 * 2 * units, "AVX-512 FMA")
        if "avx2" in flags and "fma" in flags:
            return CpuRate(8 * 2 * 2, "AVX2 FMA")
        return None
    if part in ARM_FP32_PER_CYCLE:
        core, per_cycle = ARM_FP32_PER_CYCLE[part]
        return CpuRate(per_cycle, f"{core} FMLA")
    return None


def cpu_rate(
    flags: tuple[str, ...], vendor: str | None, family: int | None, part: str | None, dtype: torch.dtype
) -> CpuRate | None:
    """FLOP/cycle/core of the fastest instructions the CPU has for `dtype`, i.e. the ceiling of the dtype
    that actually runs (dividing bf16 work by the fp32 rate would flatter MFU 2-16x).

    Documented rates, per core and cycle:
    - AMX-BF16 / AMX-FP16 (Sapphire / Granite Rapids): one TDPBF16PS / TDPFP16PS on full tiles is
      16x16x32 = 8192 multiply-adds, issued every 16 cycles: 1024 FLOP, the per-core bf16 rate Intel
      documents for AMX (Optimization Reference Manual, AMX chapter) and 16x the 64 fp32 FLOP of two
      AVX-512 FMA units.
    - AVX512-BF16 (Cooper Lake, Zen 4/5): VDPBF16PS does 32 bf16 products into 16 fp32 sums on the FMA
      ports, twice the work of an fp32 FMA per instruction, so 2x fp32. (A Zen 4 measured 2.06x in the
      policy's bf16 autocast probe.) AVX512-FP16 (Sapphire Rapids): 32 fp16 lanes per FMA, also 2x.
    - Arm BF16 (FEAT_BF16, flag "bf16"): Arm's A64 reference says BFMMLA delivers at least the bf16
      throughput of two BFDOTs, each twice an fp32 FMLA's work: 2x fp32. FP16 ("asimdhp"): 8 lanes
      per 128-bit FMLA, 2x fp32.
    - No native support: bf16/fp16 math is converted to fp32 and done there, so the fp32 rate is the
      ceiling (an honest one: conversions only make the real rate lower).
    """
    fp32 = cpu_fp32_rate(flags, vendor, family, part)
    if fp32 is None or dtype == torch.float32:
        return fp32
    x86 = vendor in ("GenuineIntel", "AuthenticAMD")
    if dtype == torch.bfloat16:
        if x86 and "amx_bf16" in flags:
            return CpuRate(1024, "AMX-BF16")
        if x86 and "avx512_bf16" in flags:
            return CpuRate(2 * fp32.per_cycle, "AVX512-BF16")
        if not x86 and "bf16" in flags:
            return CpuRate(2 * fp32.per_cycle, "BF16 BFMMLA")
        return CpuRate(fp32.per_cycle, f"bf16 emulated: {fp32.isa} rate")
    if dtype == torch.float16:
        if x86 and "amx_fp16" in flags:
            return CpuRate(1024, "AMX-FP16")
        if x86 and "avx512_fp16" in flags:
            return CpuRate(2 * fp32.per_cycle, "AVX512-FP16")
        if not x86 and "asimdhp" in flags:
            return CpuRate(2 * fp32.per_cycle, "FP16 FMLA")
        return CpuRate(fp32.per_cycle, f"fp16 emulated: {fp32.isa} rate")
    return None


def cpu_spec_peak(
    flags: tuple[str, ...],
    vendor: str | None,
    family: int | None,
    cores: int | None,
    mhz: float | None,
    dtype: torch.dtype,
    part: str | None = None,
) -> float | None:
    """cores x FLOP/cycle/core of `dtype` (see cpu_rate) x clock; None (calibrate instead) when unknown."""
    rate = cpu_rate(flags, vendor, family, part, dtype)
    if rate is None or not cores or not mhz:
        return None
    return cores * rate.per_cycle * mhz * 1e6


def at_least(peak: PeakFlops, sustained: float | None, what: str) -> PeakFlops:
    """A peak is a ceiling: a rate that was actually sustained proves it is at least that high (a VM that
    shows its nominal clock below its turbo, a table row for a lesser SKU). Without any figure (nan) a
    sustained rate alone stays unused: it is a floor, and MFU against a floor could pass 100%."""
    if sustained is None or not math.isfinite(peak.value) or sustained <= peak.value:
        return peak
    return PeakFlops(sustained, f"{what} (above the {peak.source} figure of {peak.value / 1e12:.3g} TFLOPS)")


def table_peak(device_name: str, dtype: torch.dtype) -> float | None:
    """Published dense peak for this device and dtype, or None when the table does not know it."""
    key = DTYPE_NAMES.get(dtype)
    if key is None:
        return None
    for entry in PEAK_TABLE:
        if re.search(entry.pattern, device_name, re.IGNORECASE):
            return getattr(entry, key)
    return None


def measure_matmul_flops(
    device: torch.device,
    dtype: torch.dtype,
    synchronize: Callable[[], None],
    sizes: tuple[int, ...] = (256, 512, 1024),
    budget_s: float = 0.6,
) -> float:
    """Best achieved FLOP/s of square matmuls, spending about `budget_s` seconds in total."""
    best = 0.0
    per_size = budget_s / len(sizes)
    for n in sizes:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        torch.mm(a, b)  # warm up kernels / allocator
        synchronize()
        iters, start = 0, time.perf_counter()
        while True:
            torch.mm(a, b)
            iters += 1
            if iters % 4 == 0 or n >= 1024:
                synchronize()
                elapsed = time.perf_counter() - start
                if elapsed >= per_size:
                    break
        best = max(best, 2.0 * n**3 * iters / elapsed)
    return best


def calibration_key(device_name: str, dtype: torch.dtype) -> str:
    return f"{device_name}|{DTYPE_NAMES.get(dtype, str(dtype))}|torch {torch.__version__}"


def calibration_path() -> Path:
    return portachat_home() / "calibration.json"


def load_calibration() -> dict:
    return read_json(calibration_path())


def save_calibration(device_name: str, dtype: torch.dtype, flops: float, source: str) -> None:
    """Merge one entry into the cache (locked and atomic: ranks share it)."""
    merge_json_entry(calibration_path(), calibration_key(device_name, dtype), {
        "flops": flops,
        "source": source,
        "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    })


def cached_peak(device_name: str, dtype: torch.dtype) -> PeakFlops | None:
    """The `doctor --calibrate` figure. Quick probe figures ("measured") are not trusted for MFU: a
    short or busy measurement underestimates the peak and shows MFU above 100%."""
    entry = load_calibration().get(calibration_key(device_name, dtype))
    if not isinstance(entry, dict) or not isinstance(entry.get("flops"), int | float) or entry["flops"] <= 0:
        return None
    if entry.get("source") != "calibrated":
        return None
    return PeakFlops(float(entry["flops"]), "calibrated")


def calibrate_peak(
    device_name: str,
    dtype: torch.dtype,
    measure: Callable[[], float],
    quick_probe: Callable[[], float],
    rounds: int = 3,
) -> PeakFlops:
    """Best of `rounds` large-matmul sweeps, cached only when it is trustworthy.

    Refused (nothing cached; the earlier calibration, if any, stays) when it comes out below a fresh
    quick probe on smaller matrices, which means the machine got busier during the sweep. A lower
    figure than an earlier calibration never replaces it: a peak is a ceiling, a lower reading only
    means a busier run."""
    best = max(measure() for _ in range(max(1, rounds)))
    probe = quick_probe()
    previous = cached_peak(device_name, dtype)
    if best < REFUSE_BELOW_PROBE * probe:
        return PeakFlops(previous.value if previous else float("nan"),
                         f"refused: {best / 1e12:.3g} TFLOPS is below a quick probe's {probe / 1e12:.3g} (busy "
                         "machine); rerun `portachat doctor --calibrate` when it is idle")
    if previous is not None and previous.value >= best:
        return previous
    save_calibration(device_name, dtype, best, "calibrated")
    return PeakFlops(best, "calibrated")


REFUSE_BELOW_PROBE = 0.9  # a little slack: small and large matmuls reach slightly different rates


def quick_sizes(device_type: str) -> tuple[int, ...]:
    """Matmul sizes for a short in-run measurement: a fraction of a second on a small CPU."""
    return {"cpu": (256, 512, 1024), "mps": (512, 1024)}.get(device_type, (2048, 4096))


def calibrate_sizes(device_type: str) -> tuple[int, ...]:
    """The sweep `doctor --calibrate` runs: big enough to saturate accelerators, bounded on CPU."""
    return (512, 1024, 2048) if device_type in ("cpu", "mps") else (2048, 4096, 8192)


def attention_flops_per_token(n_layer: int, n_head: int, head_dim: int, seq_len: int, causal: bool = True) -> float:
    """Training FLOPs per token of attention's two matmuls (QK^T and AV; forward 4, backward 8 per
    layer, head, head dimension and key): 12·L·H·D·T for full attention. A causal kernel (flash,
    cuDNN, memory-efficient) skips the masked half, so MFU counted as the kernel works uses 6·L·H·D·T;
    nanochat and most papers count 12, which flatters MFU: compare tokens/s with them, not MFU."""
    full = 12.0 * n_layer * n_head * head_dim * seq_len
    return full / 2 if causal else full
