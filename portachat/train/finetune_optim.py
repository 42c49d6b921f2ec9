"""The optimizer every stage that trains a loaded model uses (fine-tuning, DPO, distillation): AdamW alone.

Muon's orthogonalized updates are sized for training from scratch (see train/finetune.py); the
batch-size probe (train/finetune_batch.py) builds this same optimizer, so it lives below both.
"""

from __future__ import annotations

import torch

from portachat.i18n import _
from portachat.train.accumulation import TrainingError


def finetune_optimizer(model: torch.nn.Module, lr: float, weight_decay: float, fused: bool) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters only (all of them, or the LoRA adapter's)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise TrainingError(_("nothing to train: every parameter is frozen"))
    kwargs = dict(fused=True) if fused else dict(foreach=True)
    opt = torch.optim.AdamW([dict(params=params, lr=lr)], betas=(0.9, 0.999), eps=1e-8, weight_decay=weight_decay,
                            **kwargs)
    for group in opt.param_groups:
        group["initial_lr"] = group["lr"]
    return opt
