"""The weights' dtype for inference: the device's compute dtype on accelerators; on a CPU, measured.

bf16 halves the bytes each decode step reads, which wins where the CPU has native bf16 dot products
(AVX512-BF16, AMX) and loses where bf16 is emulated, so it is measured once per machine (a
memory-bound matrix-vector product in each dtype through the packed kernel the engine would use,
well under a second) and cached in the portachat home.
"""

from __future__ import annotations

import os
import time

import torch

from portachat.device.device import Device
from portachat.device.dtypes import DTYPES as _DTYPES
from portachat.device.dtypes import parse_dtype
from portachat.device.inference import measures_inference_dtype
from portachat.device.json_cache import merge_json_entry, read_json
from portachat.device.policy import Decision
from portachat.ops.cpu_linear import kernels_available, pack_linear
from portachat.storage.paths import portachat_home

_memo: dict[str, str] = {}


def _cache_file():
    return portachat_home() / "inference_dtype.json"


def measure_cpu_matvec(dtype: torch.dtype, rows: int = 4096, cols: int = 2048, reps: int = 6) -> float:
    """Seconds per matrix-vector product with a weight too large for the caches (decode's pattern),
    through the packed kernel the engine would use when there is one."""
    weight = torch.randn(rows, cols).to(dtype)
    x = torch.randn(1, cols).to(dtype)
    linear = pack_linear(weight) or (lambda v: torch.nn.functional.linear(v, weight))
    linear(x)  # warm up
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        linear(x)
        best = min(best, time.perf_counter() - t0)
    return best


def cpu_inference_dtype() -> Decision:
    """bf16 if a measured memory-bound matvec runs faster in bf16 than in fp32, else fp32."""
    kernels = "|own-kernels" if kernels_available("cpu") else ""
    name = torch.__version__ + "|" + str(torch.backends.cpu.get_cpu_capability()) + "|packed-1t" + kernels
    if name in _memo:
        return Decision(_DTYPES[_memo[name]], "measured earlier in this process")
    cached = read_json(_cache_file()).get(name)
    if cached in _DTYPES:
        _memo[name] = cached
        return Decision(_DTYPES[cached], f"measured before on this machine ({_cache_file()})")
    # One thread, alternating dtypes, best of several: on a busy machine thread-pool stalls and other
    # processes would otherwise decide, and a wrong answer is cached.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            fp32 = bf16 = float("inf")
            for _ in range(3):
                fp32 = min(fp32, measure_cpu_matvec(torch.float32))
                bf16 = min(bf16, measure_cpu_matvec(torch.bfloat16))
    finally:
        torch.set_num_threads(threads)
    choice = "bf16" if bf16 < 0.9 * fp32 else "fp32"
    _memo[name] = choice
    try:
        merge_json_entry(_cache_file(), name, choice)
    except OSError:
        pass  # a read-only home only costs a re-measurement next time
    return Decision(_DTYPES[choice], f"measured: bf16 matvec {bf16 * 1e6:.0f} us vs fp32 {fp32 * 1e6:.0f} us")


def inference_dtype(dev: Device, requested: str | None = None) -> Decision:
    """Dtype for inference weights and KV cache. `requested` (fp32/bf16/fp16) wins;
    PORTACHAT_INFERENCE_DTYPE is read next."""
    requested = requested or os.environ.get("PORTACHAT_INFERENCE_DTYPE") or None
    if requested and requested.strip().lower() != "auto":
        return Decision(parse_dtype(requested), f"requested ({requested})")
    if measures_inference_dtype(dev):
        return cpu_inference_dtype()
    if dev.dtype in (torch.bfloat16, torch.float16):
        return Decision(dev.dtype, f"the device's compute dtype ({dev.dtype_reason})")
    return Decision(torch.float32, f"fp32: {dev.dtype_reason}")
