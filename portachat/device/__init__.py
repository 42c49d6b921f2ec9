"""The only vendor-aware package: detection, precision/compile/attention/collective policy, memory,
telemetry, peak FLOPs and process groups for cuda / rocm / dcu / npu / xpu / mps / cpu.

Everything else in portachat asks `get_device()` instead of naming a vendor.

The names below load on first use (PEP 562), so that `portachat.device.early_env` can be imported and
run before torch is: torch_npu reads its environment when `import torch` autoloads it.
"""

from __future__ import annotations

import importlib

# (`probe` the function is not here: the package attribute of that name is its module, portachat.device.probe.)
_HOMES = {
    "Device": "device", "get_device": "device", "reset_device_cache": "device",
    "destroy_distributed": "dist", "init_distributed": "dist",
    "DistEnv": "ranks", "dist_env": "ranks",
    "DeviceError": "errors", "Diagnosis": "errors", "diagnose": "errors",
    "PeakFlops": "flops", "MemoryStats": "memory", "ProbeResult": "probe",
    "Telemetry": "telemetry",
}  # fmt: skip

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    globals()[name] = value
    return value
