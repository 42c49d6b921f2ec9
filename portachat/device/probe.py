"""Probing: read torch, the environment and vendor tools, and return raw facts.

Nothing here decides anything (see policy.py); everything here touches the real machine.
Tests build `ProbeResult` by hand to simulate hardware they do not have.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import torch
import torch.distributed as dist

from portachat.device.errors import DeviceError
from portachat.device.json_cache import merge_json_entry, read_json
from portachat.i18n import _
from portachat.storage.paths import portachat_home

KINDS = ("cuda", "rocm", "dcu", "npu", "xpu", "mps", "cpu")
# torch device type for each kind: ROCm and DCU builds of torch present themselves as "cuda".
TORCH_TYPE = {
    "cuda": "cuda",
    "rocm": "cuda",
    "dcu": "cuda",
    "npu": "npu",
    "xpu": "xpu",
    "mps": "mps",
    "cpu": "cpu",
}

VISIBLE_DEVICE_VARS = (
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "ASCEND_RT_VISIBLE_DEVICES",
    "ASCEND_VISIBLE_DEVICES",
    "ZE_AFFINITY_MASK",
)
TOOLKIT_VARS = (
    "ASCEND_TOOLKIT_HOME",
    "ASCEND_HOME_PATH",
    "ASCEND_OPP_PATH",
    "ROCM_PATH",
    "DTK_HOME",
    "CUDA_HOME",
)
DIST_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
TUNING_VARS = (
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_HIP_ALLOC_CONF",
    "PYTORCH_NPU_ALLOC_CONF",
    "NCCL_DEBUG",
    "NCCL_SOCKET_IFNAME",
    "HCCL_CONNECT_TIMEOUT",
    "HCCL_EXEC_TIMEOUT",
    "TORCH_DEVICE_BACKEND_AUTOLOAD",
)
PORTACHAT_VARS = (
    "PORTACHAT_DEVICE",
    "PORTACHAT_DTYPE",
    "PORTACHAT_COMPILE",
    "PORTACHAT_ATTENTION",
    "PORTACHAT_HOME",
    "PORTACHAT_CPU_PROBE_CACHE",
)
VENDOR_CLIS = ("nvidia-smi", "amd-smi", "rocm-smi", "hy-smi", "npu-smi")
# Hygon DCU architectures (K100 gfx926, K100_AI gfx928, BW gfx936, gfx938); Z100 reports gfx906 like AMD's MI50.
DCU_ARCHS = ("gfx926", "gfx928", "gfx936", "gfx938")


@dataclass
class ProbeResult:
    """Raw facts about the machine; every field is something read, never something decided."""

    kind: str  # one of KINDS
    device_type: str  # torch device type
    count: int = 1
    names: list[str] = field(default_factory=list)
    total_memory: list[int] = field(default_factory=list)  # bytes per device
    capability: tuple[int, int] | None = None  # CUDA compute capability
    gcn_arch: str | None = None  # HIP gcnArchName without feature suffixes, e.g. "gfx90a"
    torch_version: str = ""
    cuda_version: str | None = None  # torch.version.cuda
    hip_version: str | None = None  # torch.version.hip
    torch_npu_version: str | None = None
    torch_npu_installed: bool = False
    torch_npu_error: str | None = None  # import failure text, when torch_npu is installed but broken
    transfer_to_npu_imported: bool = False
    bf16_reported: bool | None = None  # the vendor's own is_bf16_supported(), where it is trustworthy
    macos_version: str | None = None
    triton_available: bool = False
    triton_version: str | None = None  # the installed triton distribution's version, local part included
    fused_optimizer_devices: tuple[str, ...] = ()
    default_dist_backend: str | None = None  # torch's own choice for device_type, where torch knows one
    vendor_clis: dict[str, bool] = field(default_factory=dict)  # which vendor CLIs are on PATH
    env: dict[str, str] = field(default_factory=dict)  # the relevant environment variables that are set
    cann_version: str | None = None
    dtk_version: str | None = None
    attention_kernels: tuple[
        str, ...
    ] = ()  # vendor fused-attention entry points found, e.g. npu_fusion_attention
    flex_attention: bool = False  # torch.nn.attention.flex_attention exists (torch >= 2.5)
    # CPU facts (kind "cpu"): ISA flags, usable cores, clock, and the measured bf16 autocast speed-up.
    cpu_flags: tuple[str, ...] = ()
    cpu_vendor: str | None = None  # "AuthenticAMD", "GenuineIntel", "ARM", ...
    cpu_family: int | None = None  # x86 family number (AMD 25 = Zen 3/4, 26 = Zen 5)
    cpu_part: str | None = None  # Arm "implementer:part" from /proc/cpuinfo, e.g. "0x41:0xd40" (Neoverse V1)
    cpu_cores: int | None = None  # physical cores this process may use
    cpu_max_mhz: float | None = None
    cpu_bf16_speedup: float | None = None  # fp32 time / bf16 autocast time of a training-like step

    @property
    def name(self) -> str:
        return self.names[0] if self.names else self.kind


def run_cli(args: list[str], timeout_s: float = 5.0) -> str | None:
    """Stdout of a vendor CLI, or None when it is missing, fails or hangs."""
    if shutil.which(args[0]) is None:
        return None
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def classify_hip(gcn_arch: str | None, names: list[str], hy_smi_on_path: bool) -> str:
    """A HIP build of torch runs on AMD ("rocm") or Hygon ("dcu") hardware; tell them apart."""
    if gcn_arch and gcn_arch.split(":")[0] in DCU_ARCHS:
        return "dcu"
    if any(re.search(r"\bDCU\b|Hygon|\bK100|\bZ100|\bBW\d+", n, re.IGNORECASE) for n in names):
        return "dcu"
    return "dcu" if hy_smi_on_path else "rocm"


def _env_snapshot() -> dict[str, str]:
    keys = VISIBLE_DEVICE_VARS + TOOLKIT_VARS + DIST_VARS + TUNING_VARS + PORTACHAT_VARS
    return {k: os.environ[k] for k in keys if k in os.environ}


def _load_torch_npu() -> tuple[bool, str | None, str | None]:
    """(installed, version, import error). torch_npu >= 2.5 autoloads; older ones need an import."""
    installed = "torch_npu" in sys.modules or importlib.util.find_spec("torch_npu") is not None
    if not installed:
        return False, None, None
    try:
        mod = importlib.import_module("torch_npu")
    except Exception as exc:  # a broken CANN install raises all kinds of errors at import
        return True, None, f"{type(exc).__name__}: {exc}"
    return True, str(getattr(mod, "__version__", "unknown")), None


def _dist_version(name: str) -> str | None:
    """An installed distribution's version (without importing it), e.g. Hygon's "2.1.0+das.opt1.dtk2404"."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def device_module(device_type: str):
    """torch.<device_type> (torch.cuda, torch.npu, ...), or None when this torch has no such module.

    torch.get_device_module() first; the getattr fallback serves out-of-tree backends whose device
    string torch cannot parse yet (and simulated modules in tests).
    """
    try:
        return torch.get_device_module(device_type)
    except (RuntimeError, AttributeError):
        return getattr(torch, device_type, None)


def _type_available(device_type: str) -> bool:
    if device_type == "cpu":
        return True
    if device_type == "mps":
        return bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    mod = device_module(device_type)
    try:
        return bool(mod is not None and mod.is_available())
    except (RuntimeError, AttributeError):
        return False


def _auto_type() -> str:
    acc = getattr(torch, "accelerator", None)
    if acc is not None and acc.is_available():
        return acc.current_accelerator().type
    for t in ("cuda", "npu", "xpu", "mps"):
        if _type_available(t):
            return t
    return "cpu"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        out = run_cli(["sysctl", "-n", "machdep.cpu.brand_string"])
        if out:
            return out.strip()
    return platform.processor() or platform.machine() or "cpu"


def _system_memory() -> int:
    return int(psutil.virtual_memory().total)


def _read_version_file(root: str | None, candidates: tuple[str, ...]) -> str | None:
    if not root:
        return None
    for rel in candidates:
        path = Path(root) / rel
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        m = re.search(r"(?:version|running_version)\s*=\s*\[?([\w.\-]+)", text)
        return m.group(1) if m else text.strip().splitlines()[0] if text.strip() else None
    return None


def _cann_version(env: dict[str, str]) -> str | None:
    root = env.get("ASCEND_TOOLKIT_HOME") or env.get("ASCEND_HOME_PATH")
    return _read_version_file(root, ("version.cfg", "compiler/version.info", "runtime/version.info"))


def _dtk_version(env: dict[str, str]) -> str | None:
    root = env.get("DTK_HOME") or env.get("ROCM_PATH")
    found = _read_version_file(root, (".info/version", ".info/version-dev", ".info/rocm_version"))
    if found is None and root:
        m = re.search(r"(?:dtk|rocm)-?([\d.]+)", Path(root).resolve().name)
        found = m.group(1) if m else None
    return found


def _fill_device_facts(res: ProbeResult, local_rank: int = 0) -> None:
    """Count, names, memory, capability. On Ascend the first query of a card opens a runtime context on
    it, so an NPU rank makes its own card current first and queries only that one (every rank would
    otherwise open a context on card 0; an Ascend host holds one model of card). CUDA's property
    queries open no context."""
    mod = device_module(res.device_type)
    res.count = int(mod.device_count())
    index = local_rank if 0 <= local_rank < res.count and res.count > 1 else 0
    if res.device_type == "npu" and res.count:
        mod.set_device(index)
    queried = (index,) if res.device_type == "npu" else range(res.count)
    for i in queried:
        props = mod.get_device_properties(i)
        res.names.append(str(getattr(props, "name", res.kind)))
        res.total_memory.append(int(getattr(props, "total_memory", 0)))
        if res.device_type == "cuda" and i == 0:
            res.capability = (int(props.major), int(props.minor))
            arch = getattr(props, "gcnArchName", None)
            res.gcn_arch = arch.split(":")[0] if arch else None
    if len(queried) == 1 and res.count > 1:
        res.names, res.total_memory = res.names * res.count, res.total_memory * res.count
    if res.device_type in ("npu", "xpu") and hasattr(mod, "is_bf16_supported"):
        try:
            res.bf16_reported = bool(mod.is_bf16_supported())
        except Exception:
            res.bf16_reported = None


def probe(kind: str | None = None, before_device_init: Callable[[str], None] | None = None,
          local_rank: int = 0) -> ProbeResult:  # fmt: skip
    """Probe the machine. `kind` forces a device kind (raises DeviceError when it is not there).

    `before_device_init(device_type)` runs before the first query that initialises the device's runtime
    (the caller sets runtime environment defaults there: torch_npu reads them once, at init); the device
    of `local_rank` is made current before any card is queried."""
    if kind is not None and kind not in KINDS:
        raise DeviceError(_("unknown device kind {kind}; valid kinds: {valid}").format(
            kind=repr(kind), valid=", ".join(KINDS)))
    env = _env_snapshot()
    npu_installed, npu_version, npu_error = _load_torch_npu()
    hip = getattr(torch.version, "hip", None)
    device_type = TORCH_TYPE[kind] if kind else _auto_type()
    if not _type_available(device_type):
        raise DeviceError(
            _("device {kind} was requested but torch sees no {type} device "
              "(torch {version}). Unset PORTACHAT_DEVICE / --device to auto-detect, "
              "or install the torch build for this accelerator.").format(
                kind=repr(kind), type=device_type, version=torch.__version__)
        )
    clis = {c: shutil.which(c) is not None for c in VENDOR_CLIS}
    try:
        # deferred: a private torch helper, absent from some builds (then only CUDA has fused kernels)
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        fused = tuple(_get_fused_kernels_supported_devices())
    except ImportError:
        fused = ("cuda",)
    try:
        default_backend = (
            dist.get_default_backend_for_device(device_type)
            if dist.is_available() and hasattr(dist, "get_default_backend_for_device")
            else None
        )
    except (RuntimeError, ValueError):
        default_backend = None
    res = ProbeResult(
        kind="cpu",
        device_type=device_type,
        count=1,
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda,
        hip_version=hip,
        torch_npu_version=npu_version,
        torch_npu_installed=npu_installed,
        torch_npu_error=npu_error,
        transfer_to_npu_imported="torch_npu.contrib.transfer_to_npu" in sys.modules,
        macos_version=(platform.mac_ver()[0] or None) if sys.platform == "darwin" else None,
        triton_available=importlib.util.find_spec("triton") is not None,
        triton_version=_dist_version("triton"),
        flex_attention=importlib.util.find_spec("torch.nn.attention.flex_attention") is not None,
        fused_optimizer_devices=fused,
        default_dist_backend=default_backend,
        vendor_clis=clis,
        env=env,
        cann_version=_cann_version(env),
        dtk_version=_dtk_version(env) if hip else None,
    )
    if device_type == "cuda":
        _fill_device_facts(res, local_rank)
        res.kind = classify_hip(res.gcn_arch, res.names, clis["hy-smi"]) if hip else "cuda"
        if kind in ("rocm", "dcu") and res.kind != kind:
            raise DeviceError(_("device {kind} was requested but this is a {found} machine ({name}).").format(
                kind=repr(kind), found=res.kind, name=res.name))
    elif device_type in ("npu", "xpu"):
        res.kind = device_type
        if before_device_init is not None:
            before_device_init(device_type)
        _fill_device_facts(res, local_rank)
        if device_type == "npu" and hasattr(sys.modules.get("torch_npu"), "npu_fusion_attention"):
            res.attention_kernels = ("npu_fusion_attention",)
    elif device_type == "mps":
        res.kind = "mps"
        res.names = [f"Apple {_cpu_name()} (MPS)"]
        res.total_memory = [_system_memory()]
    else:
        res.names = [_cpu_name()]
        res.total_memory = [_system_memory()]
        fill_cpu_facts(res)
    return res


# --- CPU facts -------------------------------------------------------------------------------------
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")  # x86 AMX, x86 AVX512-BF16, ARM (FEAT_BF16)
_CPU_PROBE_FILE = "cpu_probe.json"


def _cpuinfo() -> dict[str, str]:
    """First processor's fields of /proc/cpuinfo (empty off Linux)."""
    fields: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return fields
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def _cpu_max_mhz(info: dict[str, str]) -> float | None:
    try:  # the highest clock the cores run at; a VM without cpufreq shows its nominal clock in cpuinfo
        return int(Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text()) / 1000
    except (OSError, ValueError):
        pass
    try:
        return float(info["cpu MHz"])
    except (KeyError, ValueError):
        return None


def _usable_cores(info: dict[str, str]) -> int:
    logical = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:  # hyperthreads share a core's vector units
        per_core = max(1, int(info["siblings"]) // int(info["cpu cores"]))
    except (KeyError, ValueError, ZeroDivisionError):
        per_core = 1
    return max(1, logical // per_core)


def fill_cpu_facts(res: ProbeResult) -> None:
    info = _cpuinfo()
    flags = (info.get("flags") or info.get("Features") or "").split()
    if sys.platform == "darwin":
        feats = run_cli(["sysctl", "-n", "hw.optional.arm.FEAT_BF16"]) or ""
        flags = ["bf16"] if feats.strip() == "1" else []
    res.cpu_flags = tuple(flags)
    res.cpu_vendor = info.get("vendor_id") or ("ARM" if info.get("CPU implementer") else None)
    res.cpu_family = int(info["cpu family"]) if info.get("cpu family", "").isdigit() else None
    if info.get("CPU implementer") and info.get("CPU part"):
        res.cpu_part = f"{info['CPU implementer'].lower()}:{info['CPU part'].lower()}"
    res.cpu_cores = _usable_cores(info)
    res.cpu_max_mhz = _cpu_max_mhz(info)
    if any(f in res.cpu_flags for f in BF16_CPU_FLAGS):
        res.cpu_bf16_speedup = cpu_bf16_speedup(res.name, res.cpu_flags)


def cpu_probe_cache() -> Path:
    """Where the bf16 probe result is kept: per machine, so one measurement serves every run."""
    override = os.environ.get("PORTACHAT_CPU_PROBE_CACHE")
    if override:
        return Path(override)

    return portachat_home() / _CPU_PROBE_FILE


def cpu_bf16_speedup(name: str, flags: tuple[str, ...]) -> float | None:
    """The cached bf16 speed-up for this CPU and torch, measuring it (about a second) the first time."""
    key = f"{name}|{'+'.join(f for f in BF16_CPU_FLAGS if f in flags)}|torch {torch.__version__}"
    path = cpu_probe_cache()
    cached = read_json(path)
    if isinstance(cached.get(key), int | float):
        return float(cached[key])
    try:
        speedup = measure_bf16_speedup()
    except Exception:  # a broken bf16 path is a "no", never a crash
        return None
    try:
        merge_json_entry(path, key, round(speedup, 3))
    except (OSError, TimeoutError):  # an unwritable home or a stuck lock: measured again next time
        pass
    return speedup


def measure_bf16_speedup(rounds: int = 3) -> float:
    """fp32 time / bf16-autocast time of a small training-like step (two matmuls forward and backward),
    best of `rounds` each, alternating so that background load hits both alike."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(256, 512, generator=gen)
    w1 = torch.randn(512, 1024, generator=gen, requires_grad=True)
    w2 = torch.randn(1024, 512, generator=gen, requires_grad=True)

    def step() -> None:
        (torch.relu(x @ w1) @ w2).float().square().mean().backward()
        w1.grad = w2.grad = None

    def best(autocast: bool) -> float:
        times = []
        for _ in range(2):
            start = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                step()
            times.append(time.perf_counter() - start)
        return min(times)

    # One thread: the ratio is a per-core property, and on a shared machine a descheduled thread
    # stalls its peers and turns a multi-threaded timing into noise.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        best(False), best(True)  # warm up both kernels
        fp32 = bf16 = float("inf")
        for _ in range(rounds):
            fp32 = min(fp32, best(False))
            bf16 = min(bf16, best(True))
    finally:
        torch.set_num_threads(threads)
    return fp32 / bf16
