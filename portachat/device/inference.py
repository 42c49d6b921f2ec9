"""Inference-time device choices: weight dtype, decode-step compilation and graphs, KV-cache budget.

Training's dtype policy (autocast over fp32 master weights) answers a different question than
serving's (what dtype should the weights themselves be in). On accelerators the answer is the
device's compute dtype. On a CPU it depends on the chip: bf16 halves the bytes each decode step
reads, which wins where the CPU has native bf16 dot products (AVX512-BF16, AMX) and loses where bf16
is emulated, so it is measured once per machine (a memory-bound matrix-vector product in each
dtype, well under a second) and cached in the portachat home.
"""

from __future__ import annotations

import time

import torch

from portachat.device.device import Device
from portachat.device.dtypes import FLOAT_KV, KV_CACHE_DTYPES
from portachat.device.graphs import graphs_available
from portachat.device.policy import Decision
from portachat.i18n import _


def kv_cache_dtype(device: torch.device | str, weight_dtype: torch.dtype) -> torch.dtype:
    """The dtype keys and values are stored in. On a CPU attention computes in fp32 (its bf16
    batched matmuls are slow), so the cache is fp32 too: every key read each step would otherwise
    be converted again. Accelerators keep the weights' dtype (half the bytes per token)."""
    return torch.float32 if torch.device(device).type == "cpu" else weight_dtype


def host_memory(device: torch.device | str) -> bool:
    """Whether tensors on `device` live in host memory, where portachat's own CPU kernels can run."""
    return torch.device(device).type == "cpu"


def attention_compute_dtype(device: torch.device | str, dtype: torch.dtype) -> torch.dtype:
    """The dtype decode attention multiplies in: fp32 on a CPU whatever the cache holds (as
    kv_cache_dtype's float cache), the given dtype elsewhere."""
    return torch.float32 if torch.device(device).type == "cpu" else dtype


def training_engine_dtype(dev: Device) -> torch.dtype | None:
    """The dtype of the weight copy that engine work inside training (evaluations, samples, RL
    rollouts) runs on: the device's compute dtype on accelerators (bf16; fp16 on a 910A), so decode
    reads half the bytes of the fp32 master weights. None (no copy: the engine runs the master weights
    as they are) on a CPU, whose bf16 may be emulated, and where training itself runs in fp32."""
    if dev.type == "cpu" or dev.dtype == torch.float32:
        return None
    return dev.dtype


def rollout_engine_dtype(dev: Device) -> torch.dtype | None:
    """The dtype of the frozen copy RL rollouts sample from (train.rollout), refreshed in place
    after every optimizer step; None: the engine runs the training weights themselves. Accelerators
    as `training_engine_dtype`. A CPU copies in fp32, the training dtype, because a frozen copy takes
    the engine's fused CPU forward (q/k/v and gate/up as one product each, small-batch kernels that
    read the weight in place), which weights that change under the optimizer cannot: worth one more
    copy of the weights for rollouts that decode many steps per optimizer step."""
    if dev.type == "cpu":
        return torch.float32
    return training_engine_dtype(dev)


def measures_inference_dtype(dev: Device) -> bool:
    """Whether the weights' inference dtype is measured rather than read off the device: on a CPU bf16
    may be native (AVX512-BF16, AMX) or emulated, so only a measurement tells."""
    return dev.type == "cpu"


def choose_kv_cache_dtype(dev: Device, weight_dtype: torch.dtype, requested: str | None = None) -> Decision:
    """Storage dtype of the KV cache (vLLM's --kv-cache-dtype). auto: fp32 on a CPU, the weights'
    dtype on accelerators; int8 anywhere (half of bf16's bytes, a quarter of fp32's, scales
    included: ~6% more); fp8 only where the device computes it natively. Raises ValueError."""
    name = (requested or "auto").strip().lower()
    if name == "auto":
        dtype = kv_cache_dtype(dev.torch_device, weight_dtype)
        where = _("fp32 on a CPU (attention computes in fp32)") if dev.type == "cpu" else _("the weights' dtype")
        return Decision(dtype, _("auto: {where}").format(where=where))
    if name in FLOAT_KV:
        return Decision(FLOAT_KV[name], _("requested ({name})").format(name=name))
    if name == "int8":
        return Decision(torch.int8, _("requested (int8, one fp32 scale per token and kv head)"))
    if name == "fp8":
        if dev.fp8_dtype is None:
            works = ", ".join(d for d in KV_CACHE_DTYPES if d != "fp8")
            raise ValueError(_("--kv-cache-dtype fp8 needs native fp8 and {device} has none ({reason}); "
                               "use one of {works} (int8 saves the same memory)").format(
                device=dev.name, reason=dev.fp8_reason, works=works))
        return Decision(dev.fp8_dtype, _("requested (fp8 as {dtype}: {reason})").format(
            dtype=str(dev.fp8_dtype).removeprefix("torch."), reason=dev.fp8_reason))
    raise ValueError(_("--kv-cache-dtype {value} is not valid; use one of {choices}").format(
        value=repr(requested), choices=", ".join(KV_CACHE_DTYPES)))


def decode_compile(dev: Device, requested: bool | None = None, packed: bool = False,
                   paged_kernels: bool = False) -> Decision:  # fmt: skip
    """Whether the engine compiles its forward (torch.compile, dynamic shapes). Opt-in for now:
    the forward's shapes change every step and compilation takes minutes on a CPU. Never over
    packed CPU kernels: the compiler cannot lower them, and they already give what its weight
    freezing would (compiling the unpacked modules instead measured 3x slower per decode step).
    Nor over Ascend's paged-attention and cache-write kernels (`paged_kernels`, ops/npu_attention): they
    read host-side context lengths and fall back to the portable path if they raise, neither of which a
    traced graph keeps."""
    if packed:
        why = _("eager: the packed CPU kernels run the decode step (compile applies to the module path)")
        return Decision(False, why + (_(" although --compile was requested") if requested else ""))
    if paged_kernels:
        why = _("eager: Ascend's paged-attention and cache-write kernels run the decode step")
        return Decision(False, why + (_(" although --compile was requested") if requested else ""))
    if requested is not None:
        if requested and not dev.compile:
            return Decision(True, _("requested, although the device policy says eager ({reason})").format(
                reason=dev.compile_reason))
        return Decision(bool(requested), _("requested"))
    return Decision(False, _("opt-in (--compile): dynamic shapes every step; eager is the verified path"))


def decode_graphs(dev: Device, requested: bool | None = None, packed: bool = False,
                  compiled: bool = False, sharded: bool = False, paged_kernels: bool = False) -> Decision:  # fmt: skip
    """Whether the engine captures its decode steps in device graphs (vLLM's CUDA graphs; off with
    --enforce-eager). On by default where it was measured: CUDA, where a small model's decode step
    is bound by kernel launches (SmolLM2-135M on an H100: see benchmarks/README.md). Elsewhere only
    on request, where this torch can capture at all. `paged_kernels`: Ascend's paged-attention kernel
    runs decode attention (ops/npu_attention); it reads each step's context lengths on the host, which a
    replayed graph would keep from its capture."""
    if requested is False:
        return Decision(False, _("eager: requested (--enforce-eager)"))
    if packed:
        return Decision(False, _("eager: the packed CPU kernels run the decode step"))
    if paged_kernels:
        return Decision(False, _("eager: Ascend's paged-attention kernel runs decode attention (it reads the "
                                 "context lengths on the host, which a graph replay would not update)"))
    if compiled:
        return Decision(False, _("eager: the compiled forward runs the decode step (--compile)"))
    if sharded:  # a graph replays fixed addresses; FSDP gathers sharded weights into new memory each time
        return Decision(False, _("eager: the weights are sharded (FSDP) and gathered anew for every forward"))
    if not graphs_available(dev.type):
        return Decision(False, _("eager: no graph capture for {kind} in this torch").format(kind=dev.kind))
    if requested:
        return Decision(True, _("requested"))
    if dev.kind == "cuda":
        return Decision(True, _("CUDA graphs: a decode step replays as one launch (--enforce-eager: off)"))
    if dev.kind in ("npu", "rocm", "dcu"):  # as CUDA, once a capture replayed right here (engine/decode_graphs)
        return Decision(True, _("{kind} graphs: a decode step replays as one launch, kept only if a replay matches "
                              "the eager step on this device (--enforce-eager: off)").format(kind=dev.kind))
    return Decision(False, _("eager: graph capture is not verified on {kind} yet").format(kind=dev.kind))


def profiles_kv_budget(dev: Device) -> bool:
    """Whether the KV budget waits for a start-up profile (a forward at the largest batch, one graph
    captured) so that what fits at start fits under load: where the allocator reports a high-water
    mark. The CPU's budget is a share of free RAM, which a profile would not change."""
    return dev.allocator_tracks_peaks and dev.type != "mps"  # MPS keeps no high-water mark either


def kv_cache_budget(dev: Device, utilization: float, wanted_bytes: int, transient_bytes: int = 0) -> Decision:
    """Bytes for the KV cache.

    Accelerators (vLLM's rule): `utilization` of total device memory, minus what is already used
    (weights, captured graphs: measure after capturing), minus `transient_bytes` (the activations of
    the largest step, measured by the start-up profile), capped at what `wanted_bytes` (every
    sequence at full length) needs.
    CPU: `wanted_bytes`, but at most `utilization` of the memory still available, since the cache
    shares RAM with everything else on the machine.
    """
    if not 0.0 < utilization <= 1.0:
        raise ValueError(_("memory utilization must be in (0, 1], got {value}").format(value=utilization))
    stats = dev.memory()
    if dev.type == "cpu" or stats.total is None:
        free = stats.free if stats.free is not None else wanted_bytes
        budget = min(wanted_bytes, int(utilization * free))
        return Decision(budget, _("{budget} GiB: min(needed {needed} GiB, {share} of {free} GiB available)").format(
            budget=f"{budget / 2**30:.2f}", needed=f"{wanted_bytes / 2**30:.2f}", share=f"{utilization:.0%}",
            free=f"{free / 2**30:.1f}"))
    used = stats.total - (stats.free if stats.free is not None else stats.total)
    budget = int(utilization * stats.total) - used - transient_bytes
    budget = min(budget, wanted_bytes)
    peak = (_(" minus {gib} GiB for the largest step").format(gib=f"{transient_bytes / 2**30:.2f}")
            if transient_bytes else "")  # fmt: skip
    return Decision(max(budget, 0), _("{budget} GiB: {share} of {total} GiB minus {used} GiB in use{peak}").format(
        budget=f"{max(budget, 0) / 2**30:.2f}", share=f"{utilization:.0%}", total=f"{stats.total / 2**30:.1f}",
        used=f"{used / 2**30:.2f}", peak=peak))


def model_memory_budget(dev: Device, utilization: float) -> Decision:
    """Bytes the models one server keeps loaded may hold together (weights + KV caches), for the
    registry's eviction. Accelerators: `utilization` of the device's total memory (vLLM's rule for
    one model, applied to all of them). CPU: `utilization` of the RAM available at start-up, since
    the machine's other work holds the rest."""
    if not 0.0 < utilization <= 1.0:
        raise ValueError(_("memory utilization must be in (0, 1], got {value}").format(value=utilization))
    stats = dev.memory()
    if dev.type == "cpu" or stats.total is None:
        base, what = stats.free, _("available RAM")
    else:
        base, what = stats.total, _("{kind} memory").format(kind=dev.type)
    if base is None:
        return Decision(None, _("{what} unknown: no memory limit on loaded models").format(what=what))
    return Decision(int(utilization * base), _("{share} of {gib} GiB {what}").format(
        share=f"{utilization:.0%}", gib=f"{base / 2**30:.1f}", what=what))


def measure_host_to_device(dev: Device, megabytes: int = 32, reps: int = 4) -> tuple[float, str]:
    """Host-to-device copy bandwidth in GB/s and how the host side was held: "memcpy" on a CPU (a host
    copy, so the figure is comparable), "pinned", or "pageable" when pinning failed."""
    src = torch.empty(megabytes * 2**20, dtype=torch.uint8)
    if dev.type == "cpu":
        src.clone()
        start = time.perf_counter()
        for _i in range(reps):
            src.clone()
        return reps * src.numel() / (time.perf_counter() - start) / 1e9, "memcpy"
    kind = "pinned"
    try:
        src = src.pin_memory()
    except RuntimeError:
        kind = "pageable"
    src.to(dev.torch_device)
    dev.synchronize()
    start = time.perf_counter()
    for _i in range(reps):
        src.to(dev.torch_device, non_blocking=True)
    dev.synchronize()
    return reps * src.numel() / (time.perf_counter() - start) / 1e9, kind


def measure_memory_bandwidth(dev: Device, megabytes: int = 256, reps: int = 5) -> float:
    """Bytes per second the device's memory delivers, best of `reps`: the ceiling a memory-bound decode
    step is measured against (MBU). Both a copy (read + write) and a read-only reduction run, and the
    faster counts: a decode step mostly reads, and a copy alone understates what reads reach (on a CPU
    its writes also pull each destination line in first). A buffer of `megabytes` defeats the caches."""
    n = megabytes * 2**20 // 4
    src = torch.empty(n, dtype=torch.float32, device=dev.torch_device).fill_(1.0)
    dst = torch.empty_like(src)
    nbytes = src.numel() * src.element_size()

    def best_rate(op, moved: int) -> float:
        op()  # warm up (first touch, kernel selection)
        dev.synchronize()
        best = float("inf")
        for _rep in range(reps):
            t0 = time.perf_counter()
            op()
            dev.synchronize()
            best = min(best, time.perf_counter() - t0)
        return moved / best

    return max(best_rate(lambda: dst.copy_(src), 2 * nbytes), best_rate(lambda: src.sum(), nbytes))
