"""Decisions: pure functions from probed facts (ProbeResult) to choices, each with its reason.

No torch device calls and no environment reads here, so every vendor's decisions can be tested
on a laptop by building the ProbeResult its hardware would produce.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from portachat.device.dtypes import DTYPE_ALIASES, DTYPES
from portachat.device.early_env import DEFAULT_DIST_TIMEOUT_S, DIST_TIMEOUT_ENV
from portachat.device.errors import DeviceError
from portachat.device.probe import ProbeResult
from portachat.i18n import N_, _, gettext

ATTENTION_BACKENDS = ("sdpa", "npu_fusion_attention")
# How packed rows (several conversations back to back, positions restarting) attend: "flex" = compiled
# flex_attention with a document block mask (blocks wholly outside a conversation are skipped), or
# "dense_mask" = a boolean [B, 1, T, T] block-diagonal causal mask handed to attention().
PACKED_ATTENTION = ("flex", "dense_mask")
DIST_BACKENDS = {"cuda": "nccl", "rocm": "nccl", "dcu": "nccl", "npu": "hccl", "xpu": "xccl", "cpu": "gloo"}

# bf16 on HIP: torch.cuda.is_bf16_supported() answers True on every HIP device, so keep our own list.
HIP_BF16_ARCHS = ("gfx908", "gfx90a", "gfx940", "gfx941", "gfx942", "gfx950", "gfx928", "gfx936", "gfx938")
HIP_BF16_PREFIXES = ("gfx11", "gfx12")  # RDNA3/4 have bf16 WMMA
# Upstream Triton (hence inductor) does not generate code for these older GCN/CDNA1 parts.
HIP_NO_TRITON_ARCHS = ("gfx900", "gfx906", "gfx908")
# On Hygon DCUs only Hygon's own Triton build generates working code; its wheels carry "das" (DAS, the
# DCU AI software stack) in their version, e.g. triton 2.1.0+das.opt1.dtk2404. Upstream or AMD's
# Triton imports there, then fails at the first compiled step.
HYGON_TRITON_MARKS = ("das",)
SDPA_GQA_TORCH = (2, 5)  # torch.nn.functional.scaled_dot_product_attention(enable_gqa=...) appeared in 2.5


# torch_npu.npu_fusion_attention runs on Atlas A2/A3 training parts only (torch_npu API reference,
# "supported products"): SoC names Ascend910B1..B4 (A2) and Ascend910_93xx (A3, 910C). Atlas training
# parts of the first generation (Ascend910A / ProA / PremiumA / ProB) fail on the first forward.
NPU_FUSION_SOC_PREFIXES = ("910b", "910_93", "910c")


@dataclass(frozen=True)
class Decision:
    """A choice with its reason: every decision here, and the inference-time ones (device/inference.py)."""

    value: Any
    reason: str
    warning: str | None = None  # set when a forced choice goes against what the hardware supports


def normalize_dtype(name: str, source: str = "--dtype / PORTACHAT_DTYPE") -> str:
    key = name.strip().lower()
    key = DTYPE_ALIASES.get(key, key)
    if key not in DTYPES:
        raise DeviceError(
            _("{source}={value} is not a valid dtype; valid values: bf16, fp16, fp32 "
              "(or leave it unset to let portachat choose for the device).").format(source=source, value=repr(name))
        )
    return key


def bf16_support(p: ProbeResult) -> Decision:
    """Whether the device computes bf16 natively, and how we know."""
    if p.kind == "cpu":
        isa = cpu_bf16_isa(p)
        if isa:
            return Decision(True, _("{isa} computes bf16 natively").format(isa=isa))
        return Decision(False, _("no AMX / AVX512-BF16 / ARM BF16: bf16 would be emulated (slower than fp32)"))
    if p.kind == "cuda":
        cap = p.capability or (0, 0)
        ok = cap >= (8, 0)
        return Decision(ok, _("compute capability {cap} {op} 8.0 (Ampere)").format(
            cap=f"{cap[0]}.{cap[1]}", op=">=" if ok else "<"))
    if p.kind in ("rocm", "dcu"):
        arch = (p.gcn_arch or "unknown").split(":")[0]
        ok = arch in HIP_BF16_ARCHS or arch.startswith(HIP_BF16_PREFIXES)
        return Decision(
            ok,
            (_("{arch} has bf16 matrix units (own table; torch says yes on every HIP device)") if ok
             else _("{arch} has no bf16 matrix units (own table; torch says yes on every HIP device)")).format(arch=arch),
        )
    if p.kind == "npu":
        if p.bf16_reported is not None:
            return Decision(p.bf16_reported, f"torch.npu.is_bf16_supported() = {p.bf16_reported} on {p.name}")
        ok = npu_fusion_supported(p.name)  # the Atlas A2/A3 parts are exactly those with bf16
        if ok:
            why = _("Ascend 910B/910C family has bf16")
        elif "310p" in p.name.lower():
            why = _("Ascend 310P (an inference card) computes fp16, not bf16")
        else:
            why = _("Ascend 910A-class parts are fp16 only")
        return Decision(ok, f"{p.name}: {why}")
    if p.kind == "xpu":
        ok = bool(p.bf16_reported)
        return Decision(ok, f"torch.xpu.is_bf16_supported() = {p.bf16_reported}")
    if p.kind == "mps":
        version = p.macos_version or "0"
        ok = _version_tuple(version) >= (14,)
        return Decision(ok, _("macOS {version} {op} 14 (MPS bf16 needs macOS 14)").format(
            version=version, op=">=" if ok else "<"))
    raise ValueError(f"unknown kind {p.kind!r}")


CPU_BF16_ISAS = (("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX512-BF16"), ("bf16", "ARM BF16"))
CPU_BF16_MIN_SPEEDUP = 1.2  # below this the measurement is within noise of fp32: keep full precision


def cpu_bf16_isa(p: ProbeResult) -> str | None:
    """The CPU's native bf16 instruction set, from its flags."""
    return next((name for flag, name in CPU_BF16_ISAS if flag in p.cpu_flags), None)


def _cpu_dtype(p: ProbeResult) -> Decision:
    """CPU training dtype: bf16 autocast only where the CPU computes bf16 natively AND a short
    (cached) probe measured it faster than fp32; the reason quotes the measurement."""
    isa = cpu_bf16_isa(p)
    override = _("; set PORTACHAT_DTYPE=fp32|bf16 to override")
    if isa is None:
        return Decision("fp32", _("CPU without AMX / AVX512-BF16 / ARM BF16: bf16 autocast would be slower") + override)
    speedup = p.cpu_bf16_speedup
    if speedup is None:
        return Decision("fp32", _("CPU with {isa}, but the bf16 probe did not run or failed").format(isa=isa) + override)
    if speedup >= CPU_BF16_MIN_SPEEDUP:
        return Decision("bf16", _("CPU with {isa}: bf16 autocast measured {speedup}x fp32 (cached probe)").format(
            isa=isa, speedup=f"{speedup:.2f}") + override)
    return Decision("fp32", _("CPU with {isa}, but bf16 autocast measured only {speedup}x fp32 here").format(
        isa=isa, speedup=f"{speedup:.2f}") + override)


HIP_FP8_FNUZ_ARCHS = ("gfx940", "gfx941", "gfx942")  # MI300: fp8 e4m3 "fnuz" (no -0, bias 8)
HIP_FP8_ARCHS = ("gfx950",)  # MI350: the OCP e4m3fn format NVIDIA uses


def fp8_support(p: ProbeResult) -> Decision:
    """The fp8 e4m3 format the device computes natively (torch dtype name) or None, and why. Used
    for an fp8 KV cache: converting to and from fp8 is emulated elsewhere (on a CPU it measured 15x
    slower than int8's conversion), so the cache offers fp8 only where the hardware has it."""
    if p.kind == "cuda":
        cap = p.capability or (0, 0)
        ok = cap >= (8, 9)
        why = f"compute capability {cap[0]}.{cap[1]} {'>=' if ok else '<'} 8.9 (Ada/Hopper fp8)"
        return Decision("float8_e4m3fn" if ok else None, why)
    if p.kind in ("rocm", "dcu"):
        arch = (p.gcn_arch or "unknown").split(":")[0]
        if arch in HIP_FP8_FNUZ_ARCHS:
            return Decision("float8_e4m3fnuz", f"{arch} has fp8 (e4m3fnuz)")
        if arch in HIP_FP8_ARCHS:
            return Decision("float8_e4m3fn", f"{arch} has fp8 (e4m3fn)")
        return Decision(None, f"{arch} has no fp8 units")
    if p.kind == "cpu":
        return Decision(None, "CPUs have no fp8 arithmetic: conversions are emulated (slow)")
    return Decision(None, f"fp8 is not verified on {p.kind}")


def _fp16_support(p: ProbeResult) -> bool:
    if p.kind == "cuda":
        return (p.capability or (0, 0)) >= (7, 0)  # tensor cores from Volta on
    return p.kind in ("rocm", "dcu", "npu", "xpu")


def decide_dtype(p: ProbeResult, requested: str | None = None) -> Decision:
    """Compute dtype name ("bf16" | "fp16" | "fp32"). fp16 means autocast + GradScaler."""
    bf16 = bf16_support(p)
    if requested is not None:
        key = normalize_dtype(requested)
        warning = None
        if key == "bf16" and not bf16.value:
            warning = _("bf16 forced on a device without native bf16 ({reason}); expect errors or slow emulation").format(
                reason=bf16.reason)
        return Decision(key, _("requested ({value})").format(value=requested), warning)
    if p.kind == "cpu":
        return _cpu_dtype(p)
    if p.kind == "mps":
        if bf16.value:
            return Decision("bf16", f"bf16: {bf16.reason}")
        return Decision(
            "fp32", _("fp32: no bf16 ({reason}) and fp16 training on MPS lacks loss scaling support").format(
                reason=bf16.reason)
        )
    if bf16.value:
        return Decision("bf16", _("bf16: {reason}; fp32 range, so no loss scaling needed").format(reason=bf16.reason))
    if _fp16_support(p):
        return Decision("fp16", _("fp16 + GradScaler: no bf16 ({reason})").format(reason=bf16.reason))
    return Decision("fp32", _("fp32: neither bf16 nor fast fp16 ({reason})").format(reason=bf16.reason))


def decide_compile(p: ProbeResult, requested: bool | None = None) -> Decision:
    """Compile backend: "inductor" (torch.compile) or "eager"."""
    if requested is not None:
        if requested:
            auto = decide_compile(p, None)
            warning = None if auto.value == "inductor" else _("compile forced although: {reason}").format(
                reason=auto.reason)
            return Decision("inductor", _("requested (PORTACHAT_COMPILE=1 / --compile)"), warning)
        return Decision("eager", _("requested off (PORTACHAT_COMPILE=0 / --no-compile)"))
    if p.kind == "cpu":
        return Decision(
            "eager", _("CPU: compile is opt-in (minutes of compile time for short runs); PORTACHAT_COMPILE=1")
        )
    if p.kind == "npu":
        return Decision(
            "eager", _("Ascend: torch.compile needs a separate NPU graph backend; eager is the supported path")
        )
    if p.kind == "mps":
        return Decision("eager", _("MPS: inductor's Metal backend is experimental"))
    if not p.triton_available:
        return Decision("eager", _("Triton is not installed, so inductor cannot generate kernels"))
    if p.kind == "cuda" and (p.capability or (0, 0)) < (7, 0):
        return Decision("eager", _("Triton needs compute capability >= 7.0"))
    if p.kind in ("rocm", "dcu") and (p.gcn_arch or "") in HIP_NO_TRITON_ARCHS:
        return Decision("eager", _("{arch}: Triton does not target this architecture").format(arch=p.gcn_arch))
    if p.kind == "dcu" and not hygon_triton(p.triton_version):
        return Decision("eager", _("Hygon DCU: only Hygon's Triton (triton-das, from the DAS / DTK downloads) compiles "
                                   "here, and this is triton {version}; install it to compile").format(
            version=p.triton_version or "?"))
    return Decision("inductor", _("{kind}: inductor + Triton kernels (fused ops, usually 1.3-2x faster)").format(
        kind=p.kind))


def decide_attention(p: ProbeResult, requested: str | None = None) -> Decision:
    """Attention kernel family used by portachat.ops.attention()."""
    if requested is not None:
        key = requested.strip().lower()
        if key not in ATTENTION_BACKENDS:
            raise DeviceError(
                _("PORTACHAT_ATTENTION={value} is not valid; valid values: {valid}").format(
                    value=repr(requested), valid=", ".join(ATTENTION_BACKENDS))
            )
        if key != "sdpa" and key not in p.attention_kernels:
            raise DeviceError(_("attention backend {key} is not available on {kind}; use sdpa").format(key=repr(key), kind=p.kind))
        warning = None
        if key == "npu_fusion_attention" and not npu_fusion_supported(p.name):
            warning = _("npu_fusion_attention forced on {name}, which is not an Atlas A2/A3 part; "
                        "expect the first forward to fail (unset PORTACHAT_ATTENTION)").format(name=p.name)
        return Decision(key, _("requested (PORTACHAT_ATTENTION)"), warning)
    if p.kind == "npu" and "npu_fusion_attention" in p.attention_kernels:
        if npu_fusion_supported(p.name):
            return Decision(
                "npu_fusion_attention",
                _("Ascend {name} (Atlas A2/A3): torch_npu.npu_fusion_attention (fused FlashAttention kernel)").format(
                    name=p.name),
            )
        return Decision("sdpa", _("SDPA: torch_npu.npu_fusion_attention supports Atlas A2/A3 (Ascend910B*, "
                                  "Ascend910_93*) only, and this is {name}").format(name=p.name))
    reasons = {
        "cuda": N_("SDPA dispatches to FlashAttention-2 / memory-efficient kernels"),
        "rocm": N_("SDPA dispatches to the AOTriton / CK flash kernels on ROCm"),
        "dcu": N_("SDPA (DTK flash kernels where built in, math otherwise)"),
        "npu": N_("SDPA (torch_npu has no npu_fusion_attention here)"),
        "xpu": N_("SDPA dispatches to oneDNN fused attention"),
        "mps": N_("SDPA (Metal kernel)"),
        "cpu": N_("SDPA (fused flash kernel on CPU)"),
    }
    return Decision("sdpa", gettext(reasons[p.kind]))


def hygon_triton(version: str | None) -> bool:
    """Whether the installed Triton is Hygon's DCU build (its version carries a DAS mark)."""
    local = (version or "").partition("+")[2].lower()
    return any(mark in local for mark in HYGON_TRITON_MARKS)


def decide_gqa(p: ProbeResult) -> Decision:
    """How SDPA attends with fewer key/value heads than query heads (every imported GQA model):
    "native" = SDPA's enable_gqa, or "repeat_kv" = the kv heads repeated to the query heads first
    (a copy per call, but the path every backend runs)."""
    if p.kind == "npu":
        return Decision("repeat_kv", _("Ascend: torch_npu's SDPA does not implement enable_gqa (transformers turns it "
                                       "off on NPU too), so kv heads are repeated to the query heads"))
    if p.torch_version and _version_tuple(p.torch_version) < SDPA_GQA_TORCH:
        return Decision("repeat_kv", _("torch {version} has no SDPA enable_gqa (torch >= 2.5): kv heads are repeated "
                                       "to the query heads").format(version=p.torch_version))
    return Decision("native", _("SDPA enable_gqa: grouped kv heads attend without copies"))


def decide_packed_attention(p: ProbeResult, attention: Decision, compile: Decision,
                            requested: str | None = None) -> Decision:  # fmt: skip
    """How packed rows' document-masked attention runs (PACKED_ATTENTION), given the attention family
    and the compile decision already made for this device; `requested` = PORTACHAT_ATTENTION, whose
    "sdpa" keeps every fast path off."""
    if requested is not None and requested.strip().lower() == "sdpa":
        return Decision("dense_mask", _("SDPA with the packed rows' block-diagonal mask: requested "
                                        "(PORTACHAT_ATTENTION=sdpa)"))
    if attention.value == "npu_fusion_attention":
        # Its varlen form (TND layout, actual_seq_qlen) wants the cumulative lengths as host integers:
        # a device-to-host copy every forward, and untested on hardware here; the mask form is tested.
        return Decision("dense_mask", _("npu_fusion_attention with the packed rows' block-diagonal mask "
                                        "(its varlen TND form is not used)"))
    if p.kind != "cuda":
        return Decision("dense_mask", _("{kind}: SDPA with the packed rows' block-diagonal mask (flex_attention's "
                                        "fused kernel is used on CUDA only)").format(kind=p.kind))
    if not p.flex_attention:
        return Decision("dense_mask", _("SDPA with the packed rows' block-diagonal mask: this torch has no "
                                        "flex_attention (torch >= 2.5)"))
    if compile.value != "inductor":
        # flex_attention without torch.compile materializes every score: slower than SDPA with the mask.
        return Decision("dense_mask", _("SDPA with the packed rows' block-diagonal mask: flex_attention needs "
                                        "torch.compile ({reason})").format(reason=compile.reason))
    return Decision("flex", _("compiled flex_attention with a document block mask: blocks across conversations "
                              "are skipped (PORTACHAT_ATTENTION=sdpa turns it off)"))


def npu_fusion_supported(soc_name: str) -> bool:
    """Whether the Ascend SoC (torch.npu.get_device_name(), e.g. "Ascend910B3"; npu-smi says "910B3")
    runs npu_fusion_attention."""
    return soc_name.strip().lower().removeprefix("ascend").strip().startswith(NPU_FUSION_SOC_PREFIXES)


def decide_collective(p: ProbeResult) -> Decision:
    """Collective backend name; value "none" means the device runs single process only."""
    if p.kind == "mps":
        return Decision("none", _("MPS: no collective backend, single process only"))
    table = DIST_BACKENDS[p.kind]
    if p.default_dist_backend and p.default_dist_backend != table:
        return Decision(p.default_dist_backend, _("torch's default for {device}").format(device=p.device_type))
    why = {
        "nccl": N_("RCCL (behind the nccl name) on HIP") if p.kind in ("rocm", "dcu") else "NCCL",
        "hccl": N_("HCCL (Huawei collective library)"),
        "xccl": N_("oneCCL through torch's xccl backend"),
        "gloo": N_("gloo (CPU collectives)"),
    }[table]
    return Decision(table, gettext(why))


def decide_tf32(p: ProbeResult) -> Decision:
    """Whether fp32 matmuls and convolutions may run on TF32 tensor cores (10-bit mantissa inputs,
    fp32 accumulation): CUDA from compute capability 8.0 (Ampere) on. Autocast already runs the big
    matmuls in bf16; TF32 speeds up what stays fp32 (the fp32 head, fp32 runs, evaluation)."""
    if p.kind != "cuda":
        return Decision(False, _("{kind}: TF32 is a CUDA setting; fp32 matmuls keep full precision").format(kind=p.kind))
    if (p.capability or (0, 0)) < (8, 0):
        return Decision(False, _("no TF32 tensor cores before compute capability 8.0"))
    return Decision(True, _("TF32 tensor cores for fp32 matmuls and convolutions (compute capability 8.0+)"))


def decide_fused_optimizer(p: ProbeResult) -> Decision:
    """Whether AdamW(fused=True) is used; otherwise foreach (multi-tensor) kernels."""
    if p.kind == "cpu":
        return Decision(False, _("CPU: foreach AdamW (fused CPU kernels bring little and are newer)"))
    if p.kind == "npu":  # the Device keeps it only after its self-test (device/fused_adamw.py)
        return Decision(True, _("Ascend: fused AdamW where it matches foreach AdamW on this device (self-test)"))
    ok = p.device_type in p.fused_optimizer_devices
    return Decision(
        ok, (_("fused AdamW kernels exist for {device} in this torch") if ok
             else _("fused AdamW kernels do not exist for {device} in this torch")).format(device=p.device_type)
    )


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


# --- collective timeout ------------------------------------------------------------------------
def decide_dist_timeout(raw: str | None) -> Decision:
    """Seconds a collective may wait for the slowest rank. Rank 0 alone trains the tokenizer, downloads
    data and evaluates while the others wait in their next collective, so the default is long."""
    if raw is None or not raw.strip():
        return Decision(DEFAULT_DIST_TIMEOUT_S, _(
            "{seconds} s: covers rank-0-only work (tokenizer training, data download, evaluation) while the other "
            "ranks wait; set {env}=SECONDS to change it").format(seconds=DEFAULT_DIST_TIMEOUT_S, env=DIST_TIMEOUT_ENV))
    try:
        seconds = float(raw)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):  # also refuses nan
        raise DeviceError(_("{env}={value} is not valid: give the collective timeout in seconds, e.g. {env}=7200, "
                            "or unset it").format(env=DIST_TIMEOUT_ENV, value=repr(raw)))
    return Decision(seconds, _("requested ({env})").format(env=DIST_TIMEOUT_ENV))


def finetune_activation_checkpointing(device_type: str) -> bool:
    """Whether fine-tuning an existing model recomputes activations unless told: on a CPU, where the
    machine's memory (a laptop's 8-16 GB) is what the first fine-tuning example runs out of, for about a
    third of the memory at ~35% more time; not on accelerators, whose batch size is sized to their memory."""
    return device_type == "cpu"


AUTO_BATCH_CPU_POSITIONS = 4096


def auto_batch_max_positions(device_type: str) -> int | None:
    """The most padded positions `--device-batch-size auto` gives a micro-batch of a loaded model: on a CPU,
    4,096 (its throughput stops growing long before its memory runs out, and each probe is a real step:
    searching up to what the machine's memory holds would take longer than the training); None on
    accelerators, where memory is what bounds the batch."""
    return AUTO_BATCH_CPU_POSITIONS if device_type == "cpu" else None
