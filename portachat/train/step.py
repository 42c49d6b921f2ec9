"""One optimizer step's pieces outside the forward/backward: its numbers, the schedules, clip and step."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from portachat.train.config import TrainConfig
from portachat.train.hot_path import clip_with_norm
from portachat.train.schedule import lr_multiplier, muon_momentum


@dataclass
class StepStats:
    loss: float  # global summed loss / global supervised tokens
    tokens: int  # global supervised tokens
    stop: bool  # some rank asked to stop
    grad_norm: float | None = None  # total gradient norm before clipping (None: clipping off)
    real_tokens: int = 0  # global input positions holding data (padding left out)
    positions: int = 0  # global input positions computed (padding included)
    attention_pairs: float = 0.0  # global sum over sequences of length squared (attention's work)


def apply_schedules(optimizers: Sequence[torch.optim.Optimizer], step: int, cfg: TrainConfig) -> float:
    """Set every group's learning rate (and Muon's momentum) for `step`; returns the lr multiplier."""
    lrm = lr_multiplier(step, cfg.num_iterations, cfg.warmup_ratio, cfg.warmdown_ratio, cfg.final_lr_frac)
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] * lrm
            if "momentum" in group:
                group["momentum"] = muon_momentum(step, warmup_steps=cfg.muon_momentum_warmup)
    return lrm


def clip_and_step(model: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer], scaler: Any, grad_clip: float,
                  stats: StepStats, norm: torch.Tensor) -> tuple[bool, float | None]:
    """Clip (by `norm`, the device-side norm `stats.grad_norm` was read from; fp16 gradients already
    unscaled) and step every optimizer; returns (update applied, gradient norm).

    Without a scaler a non-finite loss or gradient skips the update here. With fp16's GradScaler the
    scaler itself skips an update whose gradients hold inf/NaN and lowers the loss scale, so the
    step always goes through it (calling update() without a step would be an error).
    """
    if scaler is None and not math.isfinite(stats.loss):
        return False, None
    grad_norm = stats.grad_norm
    if scaler is None and grad_norm is not None and not math.isfinite(grad_norm):
        return False, grad_norm
    clip_with_norm(model.parameters(), grad_clip, norm)
    if scaler is None:
        for opt in optimizers:
            opt.step()
        return True, grad_norm
    scale_before = scaler.get_scale()
    for opt in optimizers:
        scaler.step(opt)
    scaler.update()
    return scaler.get_scale() >= scale_before, grad_norm  # a skipped step always lowers the scale
