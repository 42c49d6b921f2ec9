"""The weights engine work inside training runs on: a frozen copy in the device's inference dtype.

Training keeps fp32 master weights; an engine sampling from them would read twice the bytes per
decode step that bf16 needs, and could never be cast in place (the optimizer owns them). So
evaluations and samples run on a copy made by `inference_copy` (`engine_weights`: every parameter cast
to `device.inference.training_engine_dtype(dev)`, buffers shared, the module structure (wrappers, tied
weights) kept; on a CPU that decision is None and the engine runs the master weights themselves), and
the rollout engine (train/rollout.py) keeps one in the device's rollout dtype, refreshed in place by
`refresh_copy`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from portachat.device import Device
from portachat.device.inference import training_engine_dtype
from portachat.model import GPT


def inference_copy(model: GPT, dtype: torch.dtype) -> GPT:
    """A frozen copy of `model` with its parameters in `dtype`, on their device; the master weights,
    their gradients and their dtype are untouched. Tied parameters stay tied (one copy)."""
    memo: dict[int, object] = {}
    with torch.no_grad():
        for p in model.parameters():
            memo[id(p)] = torch.nn.Parameter(p.detach().to(dtype, copy=True), requires_grad=False)
    for b in model.buffers():  # rotary tables and the like: read-only, so shared rather than copied
        memo[id(b)] = b
    return copy.deepcopy(model, memo).eval()


@torch.no_grad()
def refresh_copy(twin: GPT, model: GPT) -> None:
    """Copy the master weights into an existing copy in place (its addresses, hence any captured
    decode graphs over it, stay valid)."""
    for t, m in zip(twin.parameters(), model.parameters(), strict=True):
        t.copy_(m.detach())


@contextmanager
def engine_weights(model: GPT, dev: Device) -> Iterator[GPT]:
    """The model an engine should run for one evaluation: a copy in the inference dtype, freed when
    the block ends, or the model itself where the device decides no copy (the CPU)."""
    dtype = training_engine_dtype(dev)
    if dtype is None:
        yield model
        return
    twin = inference_copy(model, dtype)
    try:
        yield twin
    finally:
        del twin
