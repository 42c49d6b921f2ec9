"""Activation checkpointing: keep only each block's input and recompute the block in backward.

Memory for activations drops from all of every layer's saved tensors to one residual per layer plus
one layer's worth during its recomputation, for about one extra forward pass of compute.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from portachat.i18n import _


def apply_activation_checkpointing(model: nn.Module) -> int:
    """Wrap every transformer block's forward in torch.utils.checkpoint; returns how many were wrapped.

    Parameters and state_dict keys are unchanged (the blocks stay where they are), so checkpoints
    load either way. Inference (no grad) and KV-cache calls run the block as it is.
    """
    blocks = _blocks(model)
    for block in blocks:
        if getattr(block, "_portachat_checkpointed", False):
            continue
        block.forward = functools.partial(_checkpointed_forward, block.forward)
        block._portachat_checkpointed = True
    return len(blocks)


def _checkpointed_forward(forward, x, *args, **kwargs):
    # Anything past (cos, sin) other than the packed-row attention mask is a cache: run the block as it is.
    uses_cache = any(a is not None for a in args[2:]) or any(
        v is not None for k, v in kwargs.items() if k != "attn_mask")
    if not torch.is_grad_enabled() or uses_cache:
        return forward(x, *args, **kwargs)
    # Non-reentrant checkpointing: works with autocast, torch.compile and DDP, and replays RNG state.
    return checkpoint(forward, x, *args, use_reentrant=False, **kwargs)


def _blocks(model: nn.Module) -> list[nn.Module]:
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise ValueError(_("{model} has no .model.layers blocks to checkpoint: drop --activation-checkpointing").format(
            model=type(model).__name__))
    return list(layers)
