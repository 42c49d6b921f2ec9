"""The Device facade: one object that answers every device question the rest of portachat asks."""

from __future__ import annotations

import contextlib
import os
import threading
import time

import torch
from torch.profiler import ProfilerActivity

from portachat.device import early_env
from portachat.device import flops as flops_mod
from portachat.device import memory as memory_mod
from portachat.device.errors import DeviceError
from portachat.device.flops import PeakFlops
from portachat.device.fused_adamw import fused_adamw_proven
from portachat.device.fused_attention import KernelChoice, use_kernels
from portachat.device.memory import MemoryStats
from portachat.device.policy import (
    DTYPES,
    Decision,
    bf16_support,
    cpu_bf16_isa,
    decide_attention,
    decide_collective,
    decide_compile,
    decide_dist_timeout,
    decide_dtype,
    decide_fused_optimizer,
    decide_gqa,
    decide_packed_attention,
    decide_tf32,
    fp8_support,
)
from portachat.device.probe import KINDS, TORCH_TYPE, ProbeResult, device_module, probe
from portachat.device.ranks import dist_env
from portachat.device.telemetry import Telemetry, read_telemetry
from portachat.i18n import _

DEVICE_KINDS_ENV = ("cpu", "cuda", "rocm", "dcu", "npu", "xpu", "mps")


class Device:
    """Everything portachat needs to know about, and do with, the device this process runs on.

    Built from probed facts plus the policy's decisions; tests build one from a simulated ProbeResult.
    """

    def __init__(
        self,
        facts: ProbeResult,
        index: int = 0,
        dtype: str | None = None,
        compile: bool | None = None,
        attention: str | None = None,
        dist_timeout: str | None = None,
    ) -> None:
        self.facts = facts
        self.kind: str = facts.kind
        self.type: str = facts.device_type
        self.count: int = facts.count
        if self.type != "cpu" and not 0 <= index < max(facts.count, 1):
            raise DeviceError(
                _("device index {index} (LOCAL_RANK) but only {count} {kind} device(s) are visible; "
                  "start fewer processes (--nproc_per_node) or make more devices visible.").format(
                    index=index, count=facts.count, kind=self.kind)
            )
        self.index: int = index if self.type != "cpu" else 0
        self.name: str = facts.names[self.index] if self.index < len(facts.names) else facts.name

        self.decisions: dict[str, Decision] = {
            "dtype": decide_dtype(facts, dtype),
            "bf16": bf16_support(facts),
            "fp8": fp8_support(facts),
            "compile": decide_compile(facts, compile),
            "attention": decide_attention(facts, attention),
            "collective": decide_collective(facts),
            "fused_optimizer": decide_fused_optimizer(facts),
            "dist_timeout": decide_dist_timeout(dist_timeout),
            "tf32": decide_tf32(facts),
            "gqa": decide_gqa(facts),
        }
        d = self.decisions
        d["packed_attention"] = decide_packed_attention(facts, d["attention"], d["compile"], attention)
        self.dtype_name: str = d["dtype"].value
        self.dtype: torch.dtype = DTYPES[self.dtype_name]
        self.dtype_reason: str = d["dtype"].reason
        self.supports_bf16: bool = bool(d["bf16"].value)
        # Native fp8 e4m3 (None where it would be emulated): an fp8 KV cache is offered only then.
        self.fp8_dtype: torch.dtype | None = getattr(torch, d["fp8"].value) if d["fp8"].value else None
        self.fp8_reason: str = d["fp8"].reason
        self.needs_grad_scaler: bool = self.dtype == torch.float16
        self.compile_backend: str = d["compile"].value
        self.compile: bool = self.compile_backend != "eager"
        self.compile_reason: str = d["compile"].reason
        self.attention_backend: str = d["attention"].value
        self.attention_reason: str = d["attention"].reason
        self.packed_attention: str = d["packed_attention"].value  # policy.PACKED_ATTENTION
        self.packed_attention_reason: str = d["packed_attention"].reason
        self.fused_optimizer_reason: str = d["fused_optimizer"].reason
        self.dist_backend: str = d["collective"].value
        self.dist_reason: str = d["collective"].reason
        self.supports_distributed: bool = self.dist_backend != "none"
        self.dist_timeout_s: float = float(d["dist_timeout"].value)
        self.tf32: bool = bool(d["tf32"].value)
        self.tf32_reason: str = d["tf32"].reason
        self.gqa: str = d["gqa"].value  # "native" (SDPA enable_gqa) or "repeat_kv"
        # Runtime settings the vendor's stack reads from the environment (Ascend: allocator, task queue,
        # HCCL timeouts; DCU: HSA/HIP/RCCL); get_device() and init_distributed() set those left unset.
        self.env_defaults = early_env.runtime_env_defaults(facts.kind, self.dist_timeout_s)
        self._cpu_peak_floor: int | None = None

    @property
    def fused_optimizer(self) -> bool:
        """AdamW(fused=True): where the policy allows it, and on Ascend once its self-test passed."""
        allowed = bool(self.decisions["fused_optimizer"].value)
        return allowed and (self.kind != "npu" or fused_adamw_proven(self))

    @property
    def torch_device(self) -> torch.device:
        """torch.device for tensors (built on use: simulated devices have no registered backend)."""
        return torch.device(self.type) if self.type in ("cpu", "mps") else torch.device(self.type, self.index)

    def __repr__(self) -> str:
        return f"Device({self.kind}:{self.index} {self.name!r}, dtype={self.dtype_name}, compile={self.compile_backend})"

    @property
    def kernel_choice(self) -> KernelChoice:
        """The attention kernels this device's tensors run (handed to the ops by get_device())."""
        return KernelChoice(attention=self.attention_backend, packed=self.packed_attention, gqa=self.gqa)

    @property
    def warnings(self) -> list[str]:
        return [d.warning for d in self.decisions.values() if d.warning]

    # --- precision -------------------------------------------------------------------------------
    def autocast(self) -> contextlib.AbstractContextManager:
        """Mixed-precision context for forward passes; a no-op in fp32."""
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.type, dtype=self.dtype)

    def grad_scaler(self) -> torch.amp.GradScaler | None:
        """Loss scaler for fp16 (bf16 and fp32 need none)."""
        if not self.needs_grad_scaler:
            return None
        try:
            return torch.amp.GradScaler(self.type)
        except (RuntimeError, AssertionError, ValueError):
            # torch_npu releases that predate device-generic GradScaler ship their own
            return device_module(self.type).amp.GradScaler()

    # --- execution -------------------------------------------------------------------------------
    def synchronize(self) -> None:
        if self.type == "cpu":
            return
        acc = getattr(torch, "accelerator", None)
        if acc is not None and hasattr(acc, "synchronize") and self.type != "npu":
            acc.synchronize(self.torch_device)
        else:
            device_module(self.type).synchronize()

    def pin(self, t: torch.Tensor) -> torch.Tensor:
        """Page-locked host copy of `t` where the device copies from it asynchronously (non_blocking=True)."""
        if self.type in ("cpu", "mps") or t.device.type != "cpu":
            return t
        try:
            return t.pin_memory()  # pinned for the current accelerator (set_current() picks it)
        except RuntimeError:  # no pinned allocator for this backend: plain memory still works
            return t

    def apply_math_settings(self) -> None:
        """Process-wide math flags this device allows (TF32 on CUDA 8.0+); get_device() calls it."""
        if not self.tf32:
            return
        matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
        if hasattr(matmul, "fp32_precision"):  # torch >= 2.9's API; the flags below are its legacy form
            matmul.fp32_precision = cudnn.conv.fp32_precision = "tf32"
        else:
            matmul.allow_tf32 = cudnn.allow_tf32 = True

    def set_current(self) -> None:
        """Make this the current device of the process (before allocating or joining a process group)."""
        if self.type not in ("cpu", "mps"):
            device_module(self.type).set_device(self.index)

    # --- memory ----------------------------------------------------------------------------------
    def memory(self) -> MemoryStats:
        if self.type == "cpu":
            return memory_mod.cpu_memory(self._cpu_peak_floor)
        if self.type == "mps":
            return memory_mod.mps_memory()
        return memory_mod.accelerator_memory(self.type, self.index)

    def reset_peak_memory(self) -> None:
        if self.type == "cpu":
            self._cpu_peak_floor = memory_mod.cpu_memory(None).allocated or 0
            return
        memory_mod.reset_peak(self.type, self.index)

    def empty_cache(self) -> None:
        memory_mod.empty_cache(self.type)

    # --- randomness ------------------------------------------------------------------------------
    def manual_seed(self, seed: int) -> None:
        """Seed the CPU generator and every generator of this device type."""
        torch.manual_seed(seed)  # also seeds cuda/xpu/mps and registered PrivateUse1 backends
        if self.type not in ("cpu", "mps"):
            mod = device_module(self.type)
            if hasattr(mod, "manual_seed_all"):
                mod.manual_seed_all(seed)

    def get_rng_state(self) -> dict[str, torch.Tensor]:
        state = {"cpu": torch.get_rng_state()}
        if self.type == "mps":
            state["device"] = torch.mps.get_rng_state()
        elif self.type != "cpu":
            state["device"] = device_module(self.type).get_rng_state(self.index)
        return state

    def set_rng_state(self, state: dict[str, torch.Tensor]) -> None:
        torch.set_rng_state(state["cpu"].cpu())
        if "device" not in state or self.type == "cpu":
            return
        if self.type == "mps":
            torch.mps.set_rng_state(state["device"].cpu())
        else:
            device_module(self.type).set_rng_state(state["device"].cpu(), self.index)

    # --- monitoring ------------------------------------------------------------------------------
    def profiler_activities(self) -> list:
        """torch.profiler activities that record this device's kernels (CPU always)."""
        activities = [ProfilerActivity.CPU]
        device_activity = {"cuda": "CUDA", "xpu": "XPU", "mps": "MPS", "npu": "PrivateUse1"}.get(self.type)
        if device_activity and hasattr(ProfilerActivity, device_activity):
            activities.append(getattr(ProfilerActivity, device_activity))
        return activities

    def telemetry(self) -> Telemetry:
        return read_telemetry(self.kind, self.index, self.facts.env)

    def peak_flops(self, dtype: torch.dtype | None = None, measured: float | None = None) -> PeakFlops:
        """Peak FLOP/s of `dtype` (the dtype that runs; default the device's) for MFU: the published table,
        the CPU's spec for that dtype, else `doctor --calibrate`'s figure for it.

        Never measures on the spot (a short or busy measurement underestimates the peak and shows MFU
        above 100%); without any of the three the value is nan with source "uncalibrated". A calibrated
        rate, or `measured` (a matmul rate this run sustained in `dtype`), above the table or spec figure
        replaces it: that figure was too low, and MFU against it would be flattered.
        """
        dtype = dtype or self.dtype
        try:
            cached = flops_mod.cached_peak(self.calibration_name, dtype)
        except Exception:
            cached = None
        peak = self._spec_peak(dtype)
        if peak is None:
            peak = cached if cached is not None else PeakFlops(float("nan"), "uncalibrated")
        elif cached is not None:
            peak = flops_mod.at_least(peak, cached.value, "calibrated")
        return flops_mod.at_least(peak, measured, "measured in this run")

    def _spec_peak(self, dtype: torch.dtype) -> PeakFlops | None:
        value = flops_mod.table_peak(self.name, dtype)
        if value is not None:
            return PeakFlops(value, "table")
        if self.type != "cpu":
            return None
        f = self.facts
        cores = self._compute_cores() if f.cpu_cores else None
        rate = flops_mod.cpu_rate(f.cpu_flags, f.cpu_vendor, f.cpu_family, f.cpu_part, dtype)
        value = flops_mod.cpu_spec_peak(f.cpu_flags, f.cpu_vendor, f.cpu_family, cores, f.cpu_max_mhz, dtype, f.cpu_part)
        return PeakFlops(value, f"cpu spec, {rate.isa}") if value is not None and rate is not None else None

    def calibrate(self, dtype: torch.dtype | None = None, budget_s: float = 3.0, rounds: int = 3) -> PeakFlops:
        """`doctor --calibrate`: large matmuls, best of `rounds`, cached unless a fresh quick probe beats
        it (then the source says the calibration was refused and why)."""
        dtype = dtype or self.dtype
        sizes = flops_mod.calibrate_sizes(self.type)
        return flops_mod.calibrate_peak(
            self.calibration_name,
            dtype,
            lambda: flops_mod.measure_matmul_flops(self.torch_device, dtype, self.synchronize, sizes, budget_s / rounds),
            lambda: flops_mod.measure_matmul_flops(self.torch_device, dtype, self.synchronize, budget_s=0.3),
            rounds,
        )

    def _compute_cores(self) -> int:
        """The CPU cores this process computes on: torch's threads, at most one per physical core
        (hyperthreads share a core's vector units). CPU DDP ranks each get a share, so world x peak is
        the machine, not world times the machine."""
        threads = torch.get_num_threads()
        return min(self.facts.cpu_cores, threads) if self.facts.cpu_cores else threads

    @property
    def calibration_name(self) -> str:
        """The name `doctor --calibrate` caches this device's figure under. A CPU's figure holds for the
        number of cores it was measured on, so that number is part of the name."""
        return f"{self.name} x{self._compute_cores()} cores" if self.type == "cpu" else self.name

    def measure_matmul(self, dtype: torch.dtype | None = None, budget_s: float = 0.3) -> float:
        """FLOP/s square matmuls of `dtype` (the device's) sustain right now: for `peak_flops(measured=...)`
        in a benchmark, which keeps it only where it beats the table or spec figure."""
        dtype = dtype or self.dtype
        sizes = flops_mod.quick_sizes(self.type)
        return flops_mod.measure_matmul_flops(self.torch_device, dtype, self.synchronize, sizes, budget_s)

    # --- decisions other packages ask for, so none of them branches on the device kind ---------------
    @property
    def is_accelerator(self) -> bool:
        """Whether an accelerator does the work (False: the CPU fallback), e.g. for sizing presets."""
        return self.type != "cpu"

    @property
    def ddp_device_ids(self) -> list[int] | None:
        """DistributedDataParallel's `device_ids`: this process's device, or None on the CPU."""
        return None if self.type == "cpu" else [self.index]

    @property
    def newton_schulz_dtype(self) -> torch.dtype:
        """Muon's orthogonalisation dtype for tools that build optimizers outside the Trainer: bf16 on an
        accelerator computing in bf16, fp32 on the CPU (whose bf16 matmuls are slower for these shapes)."""
        return torch.bfloat16 if self.dtype == torch.bfloat16 and self.type not in ("cpu", "npu") else torch.float32

    @property
    def accumulate_dtype(self) -> torch.dtype:
        """dtype for float sums kept and all-reduced on this device: float64 on the CPU (exact), float32 on
        accelerators (Ascend's AI cores and HCCL lack float64 for most ops, MPS has none). Counts use int64."""
        return torch.float64 if self.type == "cpu" else torch.float32

    @property
    def allocator_tracks_peaks(self) -> bool:
        """Whether the device's allocator reports a high-water mark (the CPU's does not: count tensors)."""
        return self.type != "cpu"

    def describe(self) -> dict:
        """JSON-able summary for doctor and training logs."""
        mem = self.memory()
        return {
            "kind": self.kind,
            "type": self.type,
            "index": self.index,
            "name": self.name,
            "count": self.count,
            "total_memory": mem.total,
            "dtype": self.dtype_name,
            "dtype_reason": self.dtype_reason,
            "supports_bf16": self.supports_bf16,
            "fp8": str(self.fp8_dtype).removeprefix("torch.") if self.fp8_dtype else None,
            "fp8_reason": self.fp8_reason,
            "needs_grad_scaler": self.needs_grad_scaler,
            "compile": self.compile,
            "compile_backend": self.compile_backend,
            "compile_reason": self.compile_reason,
            "attention_backend": self.attention_backend,
            "attention_reason": self.attention_reason,
            "packed_attention": self.packed_attention,
            "packed_attention_reason": self.packed_attention_reason,
            "fused_optimizer": self.fused_optimizer,
            "fused_optimizer_reason": self.fused_optimizer_reason,
            "tf32": self.tf32,
            "tf32_reason": self.tf32_reason,
            "gqa": self.gqa,
            "gqa_reason": self.decisions["gqa"].reason,
            "dist_backend": self.dist_backend,
            "dist_reason": self.dist_reason,
            "supports_distributed": self.supports_distributed,
            "dist_timeout_s": self.dist_timeout_s,
            "dist_timeout_reason": self.decisions["dist_timeout"].reason,
            "env_defaults": early_env.env_status(self.env_defaults),
            "capability": list(self.facts.capability) if self.facts.capability else None,
            "gcn_arch": self.facts.gcn_arch,
            "cpu": {
                "cores": self.facts.cpu_cores,
                "max_mhz": self.facts.cpu_max_mhz,
                "bf16_isa": cpu_bf16_isa(self.facts),
                "bf16_speedup": self.facts.cpu_bf16_speedup,
            } if self.type == "cpu" else None,
            "warnings": self.warnings,
        }


# --- construction from the environment -----------------------------------------------------------
_CACHE: dict[tuple, Device] = {}
_LOCK = threading.Lock()


def _env_compile() -> bool | None:
    raw = os.environ.get("PORTACHAT_COMPILE")
    if raw is None or raw.strip() == "":
        return None
    key = raw.strip().lower()
    if key in ("1", "true", "yes", "on"):
        return True
    if key in ("0", "false", "no", "off"):
        return False
    raise DeviceError(_("PORTACHAT_COMPILE={value} is not valid; use 1 (compile) or 0 (eager), or unset it.").format(
        value=repr(raw)))


def _env_kind() -> str | None:
    raw = os.environ.get("PORTACHAT_DEVICE")
    if raw is None or raw.strip() in ("", "auto"):
        return None
    key = raw.strip().lower()
    if key not in DEVICE_KINDS_ENV:
        raise DeviceError(
            _("PORTACHAT_DEVICE={value} is not valid; valid values: {valid}.").format(
                value=repr(raw), valid=", ".join(("auto", *DEVICE_KINDS_ENV)))
        )
    return key


def get_device(kind: str | None = None, dtype: str | None = None, compile: bool | None = None,
               replica: int | None = None) -> Device:
    """The process's Device, cached per arguments and environment.

    kind None auto-detects (or reads PORTACHAT_DEVICE); dtype None reads PORTACHAT_DTYPE, then the
    policy; compile None reads PORTACHAT_COMPILE, then the policy. LOCAL_RANK picks the device index,
    unless `replica` does: the i-th visible device, for engine replicas one process runs side by side
    (CPU and MPS replicas share the one device).
    """
    kind = kind.lower() if kind else _env_kind()
    if kind is not None and kind not in KINDS:
        raise DeviceError(_("device {kind} is not valid; valid values: {valid}.").format(kind=repr(kind), valid=", ".join(KINDS)))
    if dtype is None:
        env_dtype = os.environ.get("PORTACHAT_DTYPE")
        dtype = env_dtype if env_dtype and env_dtype.strip() and env_dtype.strip().lower() != "auto" else None
    if compile is None:
        compile = _env_compile()
    attention = os.environ.get("PORTACHAT_ATTENTION") or None
    dist_timeout = os.environ.get(early_env.DIST_TIMEOUT_ENV) or None
    local_rank = dist_env().local_rank
    key = (kind, dtype, compile, attention, dist_timeout, local_rank, replica)
    with _LOCK:
        if key not in _CACHE:
            timeout_s = float(decide_dist_timeout(dist_timeout).value)
            facts = probe(kind, lambda device_type: early_env.apply_env_defaults(early_env.runtime_env_defaults(
                early_env.runtime_kind(kind, device_type), timeout_s)), local_rank=local_rank)
            index = device_index(local_rank, facts) if replica is None else replica_index(replica, facts)
            dev = Device(facts, index=index, dtype=dtype, compile=compile, attention=attention,
                         dist_timeout=dist_timeout)
            early_env.apply_env_defaults(dev.env_defaults)  # before the first tensor reaches the device
            dev.apply_math_settings()
            # Once, when built, and for its own device type only: asking for another device (the CPU
            # for host-side work) never changes what this process's accelerator tensors run.
            use_kernels(dev.type, dev.kernel_choice)
            _CACHE[key] = dev
        return _CACHE[key]


def device_index(local_rank: int, facts: ProbeResult) -> int:
    """This process's device: LOCAL_RANK when every rank sees all devices (torchrun's way), 0 when the
    launcher gives each rank exactly one visible device (per-task binding), 0 on cpu/mps."""
    if TORCH_TYPE[facts.kind] in ("cpu", "mps") or facts.count == 1:
        return 0
    return local_rank


def device_holding(where: torch.device) -> Device | None:
    """The Device for tensors already at `where`: the CPU device for host tensors, this process's
    device when `where` is it, else None (the caller holds a tensor on another device)."""
    if where.type == "cpu":
        return get_device("cpu")
    dev = get_device()
    here = dev.torch_device
    if here.type != where.type or (here.index or 0) != (where.index or 0):
        return None
    return dev


def replica_index(replica: int, facts: ProbeResult) -> int:
    """The device of engine replica `replica`: one device each; CPU and MPS replicas share device 0."""
    if TORCH_TYPE[facts.kind] in ("cpu", "mps"):
        return 0
    if not 0 <= replica < facts.count:
        visible = {"cuda": "CUDA_VISIBLE_DEVICES", "rocm": "HIP_VISIBLE_DEVICES", "dcu": "HIP_VISIBLE_DEVICES",
                   "npu": "ASCEND_RT_VISIBLE_DEVICES", "xpu": "ZE_AFFINITY_MASK"}.get(facts.kind, _("the visible devices"))
        raise DeviceError(_("replica {replica} needs device {replica}, but this process sees {count} "
                            "{kind} device(s): lower --data-parallel-size, or check {visible}.").format(
            replica=replica, count=facts.count, kind=facts.kind, visible=visible))
    return replica


def reset_device_cache() -> None:
    with _LOCK:
        _CACHE.clear()


def timed(fn, dev: Device) -> float:
    """Seconds `fn()` takes on `dev`, synchronizing so queued device work is counted."""
    dev.synchronize()
    start = time.perf_counter()
    fn()
    dev.synchronize()
    return time.perf_counter() - start
