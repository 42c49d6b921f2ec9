"""Memory statistics per device, with the fallbacks older torch and torch_npu need."""

from __future__ import annotations

import resource
import sys
from dataclasses import dataclass

import psutil
import torch

from portachat.device.probe import device_module


@dataclass
class MemoryStats:
    allocated: int | None  # bytes held by live tensors (CPU: process RSS)
    peak_allocated: int | None  # high-water mark of `allocated` since the last reset
    reserved: int | None  # bytes the caching allocator holds
    free: int | None  # device (CPU: system) memory free
    total: int | None  # device (CPU: system) memory total


def _accelerator_call(device_type: str, name: str, index: int):
    """torch.accelerator.<name> first (torch >= 2.9), then the device module's function of that name.

    torch_npu before 2.13 does not serve torch.accelerator memory calls, so NPU goes to torch.npu first.
    """
    mod = device_module(device_type)
    acc = getattr(torch, "accelerator", None)
    order = [mod, acc] if device_type == "npu" else [acc, mod]
    for source in order:
        fn = getattr(source, name, None) if source is not None else None
        if fn is None:
            continue
        try:
            return fn(index)
        except (RuntimeError, AttributeError, NotImplementedError, TypeError):
            continue
    return None


def _mem_info(device_type: str, index: int) -> tuple[int | None, int | None]:
    for source_name, fn_name in (("accelerator", "get_memory_info"), ("module", "mem_get_info")):
        source = (
            getattr(torch, "accelerator", None)
            if source_name == "accelerator"
            else device_module(device_type)
        )
        fn = getattr(source, fn_name, None)
        if fn is None:
            continue
        try:
            free, total = fn(index)
            return int(free), int(total)
        except (RuntimeError, AttributeError, NotImplementedError, TypeError):
            continue
    return None, None


def accelerator_memory(device_type: str, index: int) -> MemoryStats:
    free, total = _mem_info(device_type, index)
    return MemoryStats(
        allocated=_accelerator_call(device_type, "memory_allocated", index),
        peak_allocated=_accelerator_call(device_type, "max_memory_allocated", index),
        reserved=_accelerator_call(device_type, "memory_reserved", index),
        free=free,
        total=total,
    )


def mps_memory() -> MemoryStats:
    mps = torch.mps
    total = mps.recommended_max_memory() if hasattr(mps, "recommended_max_memory") else None
    reserved = mps.driver_allocated_memory()
    return MemoryStats(
        allocated=mps.current_allocated_memory(),
        peak_allocated=None,  # MPS keeps no high-water mark
        reserved=reserved,
        free=max(total - reserved, 0) if total is not None else None,
        total=total,
    )


def process_peak_rss() -> int:
    """Peak resident set size of this process (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def cpu_memory(peak_floor: int | None) -> MemoryStats:
    """Process RSS as `allocated`; `peak_floor` is the RSS at the last reset (None: since start)."""
    rss = int(psutil.Process().memory_info().rss)
    vm = psutil.virtual_memory()
    peak = process_peak_rss() if peak_floor is None else max(peak_floor, rss)
    return MemoryStats(
        allocated=rss,
        peak_allocated=max(peak, rss),
        reserved=None,
        free=int(vm.available),
        total=int(vm.total),
    )


def reset_peak(device_type: str, index: int) -> None:
    if device_type in ("cpu", "mps"):
        return
    _accelerator_call(device_type, "reset_peak_memory_stats", index)


def empty_cache(device_type: str) -> None:
    if device_type == "cpu":
        return
    mod = device_module(device_type)
    if hasattr(mod, "empty_cache"):
        mod.empty_cache()
