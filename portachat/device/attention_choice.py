"""Which fused SDPA kernel training attention prefers, chosen by measuring the candidates on the device.

torch tries SDPA's kernels in a fixed priority order (flash, memory-efficient, math, then cuDNN), but
which is fastest depends on the chip and the shape: on Hopper cuDNN's attention is much faster than
FlashAttention-2, and torch never reaches it. So the candidates are timed once, forward and backward
at the run's causal attention shape, and the fastest goes first in torch's priority order (every
kernel stays enabled: a call the preferred one cannot take falls through to the next, as before). The
result is cached per device, shape, dtype and torch version, like the calibrated peak FLOPs. Only CUDA
and ROCm builds have the choice; elsewhere (CPU, NPU, XPU, MPS) there is nothing to choose.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from portachat.device.device import Device
from portachat.device.json_cache import merge_json_entry, read_json
from portachat.device.policy import Decision
from portachat.i18n import _
from portachat.storage.paths import portachat_home

CANDIDATES = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
              "efficient": SDPBackend.EFFICIENT_ATTENTION}  # fmt: skip
# (candidate name, forward + backward once) -> seconds; raises RuntimeError when the kernel cannot run
Timer = Callable[[str, Callable[[], None]], float]
_held = contextlib.ExitStack()  # the priority order applied for the rest of the process


def measures_attention(dev: Device) -> bool:
    """Whether SDPA's kernel is chosen by measurement: CUDA/ROCm builds running SDPA."""
    return dev.type == "cuda" and dev.attention_backend == "sdpa"


def cache_path() -> Path:
    return portachat_home() / "attention.json"


def cache_key(dev: Device, shape: tuple[int, int, int, int, int], dtype: torch.dtype) -> str:
    batch, heads, kv_heads, seq, head_dim = shape
    dt = str(dtype).removeprefix("torch.")
    return f"{dev.name}|{dt}|b{batch} h{heads}/{kv_heads} t{seq} d{head_dim}|torch {torch.__version__}"


def _load() -> dict:
    return read_json(cache_path())


def _save(key: str, entry: dict) -> None:
    """Merge one entry (locked and atomic: ranks share the file)."""
    merge_json_entry(cache_path(), key, entry)


def device_timer(dev: Device, reps: int = 3) -> Timer:
    """Best of `reps` after a warm-up, synchronizing so the device's work is counted."""

    def timer(_name: str, fn: Callable[[], None]) -> float:
        fn()
        best = float("inf")
        for _rep in range(reps):
            dev.synchronize()
            start = time.perf_counter()
            fn()
            dev.synchronize()
            best = min(best, time.perf_counter() - start)
        return best

    return timer


def _attention_step(dev: Device, shape: tuple[int, int, int, int, int], dtype: torch.dtype,
                    backend: SDPBackend) -> Callable[[], None]:  # fmt: skip
    """Causal attention forward and backward at `shape`, with only `backend` allowed."""
    batch, heads, kv_heads, seq, head_dim = shape
    inputs: list[torch.Tensor] = []

    def step() -> None:
        if not inputs:  # made on the first call: a timer may decide without running anything
            # its own generator: measuring must not move the run's random stream (the cache skips it later)
            gen = torch.Generator(device=dev.torch_device).manual_seed(0)
            where = dict(device=dev.torch_device, dtype=dtype, requires_grad=True, generator=gen)
            inputs.extend([torch.randn(batch, heads, seq, head_dim, **where),
                           torch.randn(batch, kv_heads, seq, head_dim, **where),
                           torch.randn(batch, kv_heads, seq, head_dim, **where)])  # fmt: skip
        q, k, v = inputs
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv_heads != heads)
            out.sum().backward()

    return step


def choose_attention_kernel(dev: Device, shape: tuple[int, int, int, int, int], dtype: torch.dtype,
                            timer: Timer | None = None) -> Decision:  # fmt: skip
    """The SDPA kernel to prefer for causal attention of `shape` = (batch, heads, kv heads, sequence,
    head dim) in `dtype`: a cached measurement, else the candidates timed now (value None: torch's
    own order, where there is nothing to choose or no candidate ran)."""
    if not measures_attention(dev):
        return Decision(None, _("{kind}: SDPA's own kernel choice (nothing to measure)").format(kind=dev.kind))
    key = cache_key(dev, shape, dtype)
    entry = _load().get(key)
    if isinstance(entry, dict) and entry.get("kernel") in CANDIDATES:
        return Decision(entry["kernel"], _("{kernel}: fastest measured ({times} ms, cached)").format(
            kernel=entry["kernel"], times=entry.get("times_ms")))
    timer = timer or device_timer(dev)
    times: dict[str, float] = {}
    for name, backend in CANDIDATES.items():
        try:
            times[name] = timer(name, _attention_step(dev, shape, dtype, backend))
        except RuntimeError:  # this kernel cannot take the shape / dtype / chip: not a candidate
            continue
    if not times:
        return Decision(None, _("no fused SDPA kernel ran at this shape: SDPA's own choice"))
    best = min(times, key=times.__getitem__)
    shown = {n: round(1000 * t, 3) for n, t in times.items()}
    _save(key, {"kernel": best, "times_ms": shown})
    return Decision(best, _("{kernel}: fastest measured ({times} ms)").format(kernel=best, times=shown))


def prefer_attention_kernel(name: str | None) -> None:
    """Put kernel `name` first in SDPA's priority order for the rest of the process, every other
    kernel enabled after it in torch's order (None: torch's order back)."""
    _held.close()
    if name is None:
        return
    first = CANDIDATES[name]
    order = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH, SDPBackend.CUDNN_ATTENTION]
    extra = getattr(SDPBackend, "OVERRIDEABLE", None)  # a kernel left out of the list would be disabled
    rest = [b for b in order if b != first] + ([extra] if extra is not None else [])
    _held.enter_context(sdpa_kernel([first, *rest], set_priority=True))
