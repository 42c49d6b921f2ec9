"""What keeps the training step loop fast: no garbage-collector scans inside it, and the gradient norm
computed on the device so that a step reads everything it needs from the device in one transfer.

Python's cyclic GC scans every tracked object when it runs; with a model, its optimizer state and a
data pipeline alive that is hundreds of milliseconds at random steps (nanochat measured ~500 ms).
Everything made during set-up lives for the whole run, so it is frozen (never scanned again) and the
automatic collector is off inside the loop; evaluations and saves, which pause anyway, collect.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable

import torch
from torch.distributed.tensor import DTensor

from portachat.device import Device
from portachat.device.attention_choice import choose_attention_kernel, prefer_attention_kernel
from portachat.device.flops import attention_flops_per_token
from portachat.device.policy import Decision
from portachat.model import GPT

MFU_ATTENTION = "causal"  # how MFU counts attention FLOPs: as the causal kernel computes them (half of full)


def freeze_gc() -> None:
    """Before the step loop: collect once, freeze what survives, stop automatic collections."""
    gc.collect()
    gc.freeze()
    gc.disable()


def thaw_gc() -> None:
    """After the loop (also when it fails): the collector as Python starts with it."""
    gc.unfreeze()
    gc.enable()


GC_COLLECT_EVERY = 1000  # steps: a run without evaluations still frees its cycles (nanochat: 5000)


def collect_garbage(step: int | None = None) -> None:
    """At evaluations and saves (no step given), where a pause costs a step nothing, and every
    GC_COLLECT_EVERY steps of the loop: the cycles made since the freeze."""
    if step is None or step % GC_COLLECT_EVERY == 0:
        gc.collect()


def device_grad_norm(params: Iterable[torch.nn.Parameter], optimizers: list, scaler, grad_clip: float,
                     device: torch.device) -> torch.Tensor:  # fmt: skip
    """The gradients' total L2 norm as a 0-d device tensor, without a host sync (zero when clipping is
    off: nothing reads it then). With fp16's scaler the gradients are unscaled first, once per step."""
    if scaler is not None:
        for opt in optimizers:
            scaler.unscale_(opt)
    if grad_clip <= 0:
        return torch.zeros((), device=device)
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), device=device)
    return torch.nn.utils.get_total_norm(grads)  # a DTensor over FSDP2 shards: clip_with_norm takes it so


def readable(norm: torch.Tensor) -> torch.Tensor:
    """The norm as a plain fp32 device tensor, to join the step's one transfer."""
    if isinstance(norm, DTensor):  # FSDP2: the norm over every rank's shard
        norm = norm.full_tensor()
    return norm.float().reshape(1)


def clip_with_norm(params: Iterable[torch.nn.Parameter], grad_clip: float, norm: torch.Tensor) -> None:
    """clip_grad_norm_'s scaling with the norm already computed (no second reduction, no sync)."""
    if grad_clip > 0:
        torch.nn.utils.clip_grads_with_norm_(params, grad_clip, norm)


def causal_flops_per_token(model: GPT, seq_len: int) -> float:
    """Training FLOPs per token as the kernels do them: the model's count with attention's full
    12·L·H·D·T replaced by the causal half (device.flops.attention_flops_per_token)."""
    c = model.config
    full = attention_flops_per_token(c.n_layer, c.n_head, c.head_dim, seq_len, causal=False)
    return model.flops_per_token(seq_len) - full + attention_flops_per_token(c.n_layer, c.n_head, c.head_dim, seq_len)


def choose_attention(dev: Device, model: GPT, batch: int, seq_len: int) -> Decision:
    """The SDPA kernel training attention prefers, measured at this run's shape (cached), applied for
    the rest of the process; value None where torch's own order stands."""
    c = model.config
    choice = choose_attention_kernel(dev, (batch, c.n_head, c.n_kv_head, seq_len, c.head_dim), dev.dtype)
    prefer_attention_kernel(choice.value)
    return choice
