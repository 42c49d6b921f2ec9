"""The only vendor-aware package: detection, precision/compile/attention/collective policy, memory,
telemetry, peak FLOPs and process groups for cuda / rocm / dcu / npu / xpu / mps / cpu.

Everything else in portachat asks `get_device()` instead of naming a vendor.
"""

from portachat.device.device import Device, get_device, reset_device_cache
from portachat.device.dist import DistEnv, destroy_distributed, dist_env, init_distributed
from portachat.device.errors import DeviceError, Diagnosis, diagnose
from portachat.device.flops import PeakFlops
from portachat.device.memory import MemoryStats
from portachat.device.probe import ProbeResult, probe
from portachat.device.telemetry import Telemetry

__all__ = [
    "Device",
    "DeviceError",
    "Diagnosis",
    "DistEnv",
    "MemoryStats",
    "PeakFlops",
    "ProbeResult",
    "Telemetry",
    "destroy_distributed",
    "diagnose",
    "dist_env",
    "get_device",
    "init_distributed",
    "probe",
    "reset_device_cache",
]
