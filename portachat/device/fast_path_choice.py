"""Which fast paths are candidates on a device: a pure decision from the probed facts.

A candidate is only a proposal: ops/selftest.py runs it beside its portable reference on the device
before the first use (fast_paths.verdict), and only a candidate that agrees is used. The vendor
documents where each kernel runs; outside that it is not even tried.
"""

from __future__ import annotations

from collections.abc import Callable

from portachat.device.policy import npu_fusion_supported
from portachat.device.probe import ProbeResult

# Ascend kernels of the Atlas training series (910A and later): RMSNorm and rotary (torch_npu API reference).
NPU_ALL_SOCS = ("npu_rms_norm", "npu_rotary_mul")
# Kernels documented for Atlas A2/A3 only (Ascend910B*, Ascend910_93*): SwiGLU, incremental attention,
# paged attention with its cache writes, and the fused top-k/top-p filter.
NPU_A2_A3 = ("npu_swiglu", "npu_fused_infer_attention_score", "npu_paged_attention", "npu_reshape_and_cache",
             "npu_top_k_top_p")
# The CPU's own fast paths: portachat's C kernels and oneDNN / MKL pre-packed weights (ops/cpu_*.py).
CPU = ("cpu_kernels", "cpu_packed_linear")
# Kinds whose decode steps may replay from device graphs (device/graphs.py: CUDA graphs, on ROCm/DCU the
# same API over hipGraph, torch_npu's NPUGraph, XPUGraph): candidate "decode_graphs".
DECODE_GRAPHS = ("cuda", "rocm", "dcu", "npu", "xpu")


def candidates(p: ProbeResult, has_op: Callable[[str], bool], packed_attention: str = "dense_mask",
               attention: str = "sdpa") -> tuple[str, ...]:  # fmt: skip
    """The fast paths worth checking on this device: `has_op(name)` says whether the vendor library here
    exposes the kernel (an older torch_npu may lack one); `packed_attention` and `attention` are the
    device's policy.decide_packed_attention / decide_attention values ("flex" makes compiled flex
    attention a candidate, "npu_fusion_attention" Ascend's fused attention)."""
    found: list[str] = []
    if p.kind == "cpu":
        found += CPU
    if p.kind == "npu":
        names = NPU_ALL_SOCS + (NPU_A2_A3 if npu_fusion_supported(p.name) else ())
        names += ("fused_adamw",)  # torch's fused=True, if this torch_npu implements it
        if attention == "npu_fusion_attention":  # the device layer's attention family (policy.decide_attention)
            names += ("npu_fusion_attention",)
        found += [n for n in names if has_op(n)]
    if packed_attention == "flex":
        found.append("flex_attention")
    if p.kind in DECODE_GRAPHS:
        found.append("decode_graphs")
    return tuple(found)


def filters_whole_batch(device_type: str) -> bool:
    """Whether the sampler filters top-k / top-p over the whole batch at once (a sort of every row, no host
    sync) rather than row by row: on accelerators, where each row's check of its nucleus would wait for
    the device; not on a CPU, where the row-by-row search among a row's few likeliest tokens is cheaper
    than sorting the vocabulary and waiting costs nothing."""
    return device_type != "cpu"


KV_BLOCK_DEFAULT = 16  # tokens per KV block where nothing reads the cache in a vendor's block layout


def kv_block_size(kind: str, attention_backend: str) -> tuple[int, str]:
    """Tokens per KV block for the engine's cache, and why: 128 on Ascend (the block size vllm-ascend gives
    its paged-attention and cache-write kernels); on a DCU 64 with a flash-attention backend (Hygon's
    vLLM build pages by 64), 16 with SDPA; 16 elsewhere (the engine's default, vLLM's)."""
    if kind == "npu":
        return 128, "Ascend: 128-token blocks, as its paged-attention kernels read them"
    if kind == "dcu" and "flash" in attention_backend:
        return 64, "DCU with flash attention: 64-token blocks"
    return KV_BLOCK_DEFAULT, f"{kind}: {KV_BLOCK_DEFAULT}-token blocks"
