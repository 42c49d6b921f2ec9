"""The KV-cache budget, taken after a start-up profile so that what fits at start fits under load.

Decode attention gathers each row's whole K/V (plus fp32 scores) per layer, so the largest step's
activations grow with running sequences x context: a budget taken from free memory alone leaves
too little for them and a busy engine runs out of memory mid-request. Before the cache exists, the
engine's model runs one eager decode step at the largest batch (every running sequence at the full
context, padding rows over a one-block scratch cache) and, where decode graphs are on, captures the
largest graph bucket (the shared pool's size). The budget is what stays free after both, minus the
profiled step's activations (vLLM's profile run). The CPU's budget is a share of free RAM: no profile.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch.distributed.tensor import DTensor

from portachat.device import Device
from portachat.device.graphs import GraphCapturer
from portachat.device.inference import decode_graphs, kv_cache_budget, profiles_kv_budget
from portachat.device.policy import Decision
from portachat.engine.config import EngineConfig
from portachat.engine.decode_graphs import DecodeGraphs
from portachat.engine.runner import ModelRunner
from portachat.engine.types import EngineError
from portachat.i18n import _
from portachat.model.gpt import GPT


def profiled_kv_budget(dev: Device, model: GPT, config: EngineConfig, max_model_len: int, dtype: torch.dtype,
                       kv_dtype: torch.dtype, wanted_bytes: int) -> Decision:  # fmt: skip
    """Bytes for the KV cache, measured after the start-up profile (see the module's docstring)."""
    util = config.gpu_memory_utilization
    sharded = any(isinstance(p, DTensor) for p in model.parameters())
    # Tensor-parallel shards and FSDP weights run collectives inside a forward: no lone profile step.
    if not profiles_kv_budget(dev) or sharded or getattr(model, "tensor_parallel", None) is not None:
        return kv_cache_budget(dev, util, wanted_bytes)
    transient, captured = profile_largest_step(dev, model, config, max_model_len, dtype, kv_dtype)
    choice = kv_cache_budget(dev, util, wanted_bytes, transient)  # with the captured graph's pool in use
    del captured  # the engine's own capture takes as much again once its cache exists
    dev.empty_cache()  # hand the trial pool back before the cache is allocated
    return replace(choice, reason=choice.reason + _(" (after a profile step of {seqs} x {tokens} tokens)").format(
        seqs=config.max_num_seqs, tokens=max_model_len))


def profile_largest_step(dev: Device, model: GPT, config: EngineConfig, max_model_len: int, dtype: torch.dtype,
                         kv_dtype: torch.dtype) -> tuple[int, DecodeGraphs | None]:  # fmt: skip
    """Bytes the largest decode step allocates above steady state, and the graphs holding the largest
    bucket's capture (None without graphs): its pool stays reserved while the caller measures.
    Raises EngineError when the step alone does not fit."""
    scratch = ModelRunner(model, 0, config.block_size, max_model_len, dev.torch_device, dtype, kv_dtype)
    args = (scratch._forward_modules, config.block_size, scratch.scratch_block, config.max_num_seqs,
            max_model_len, model.config.vocab_size, dev.torch_device)  # fmt: skip
    eager = DecodeGraphs(*args, capturer=None, capture_now=False, max_batch=config.max_num_seqs)
    graphs_on = decode_graphs(dev, False if config.enforce_eager else None, compiled=bool(config.compile),
                              paged_kernels=scratch.slot_major).value
    trial = DecodeGraphs(*args, capturer=GraphCapturer(dev.type), capture_now=False) if graphs_on else None
    try:
        dev.empty_cache()
        dev.reset_peak_memory()
        before = dev.memory().allocated or 0
        eager.profile(eager.buckets[-1], eager.max_blocks)
        dev.synchronize()
        peak = dev.memory().peak_allocated
        transient = max((peak or before) - before, 0)
        del eager
        if trial is not None:  # its pool stays reserved while the budget is measured
            trial.capture(*trial.all_buckets()[0])
        dev.empty_cache()  # the profile's freed blocks are counted in `transient`, not as "in use"
        return transient, trial
    except torch.OutOfMemoryError as exc:
        raise EngineError(
            _("one decode step of {seqs} sequences at {tokens} tokens does not fit in device memory ({error}); "
              "lower --max-num-seqs or --max-model-len").format(seqs=config.max_num_seqs, tokens=max_model_len,
                                                                error=exc), kind="invalid",
        ) from exc
