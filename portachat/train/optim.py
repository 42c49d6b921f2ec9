"""Optimizers: Muon for the hidden weight matrices, AdamW for everything else (as nanochat).

Muon orthogonalizes each matrix update with a few Newton-Schulz iterations, which lets the
transformer's 2-D weights take much larger steps than Adam would allow. Embeddings, the LM head
and 1-D parameters (norm gains) stay on AdamW, where Muon's geometry does not apply.
"""

from __future__ import annotations

import torch
from torch import nn

from portachat.device import Device
from portachat.train.muon_split import add_update, full, orthogonalize
from portachat.train.optim_config import OptimConfig  # noqa: F401 - its home is torch-free (the CLI reads its defaults)


@torch.no_grad()
def newton_schulz(grad: torch.Tensor, steps: int = 5, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Approximately orthogonalize `grad` (U S V^T -> U V^T) with the quintic iteration of Muon."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = grad.to(dtype)
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    if tall:
        x = x.mT
    return x


class Muon(torch.optim.Optimizer):
    """MomentUm Orthogonalized by Newton-schulz, for 2-D parameters only.

    `ns_dtype` is bf16 on devices with fast bf16 matmuls and fp32 elsewhere (CPU, fp16-only chips),
    where bf16 would be slow or the iteration would lose too much precision. Data-parallel ranks
    share the Newton-Schulz work (`split_across_ranks`, see muon_split.py); FSDP2 shards are gathered
    into whole matrices first.
    """

    def __init__(
        self,
        params,
        lr: float = 0.02,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        ns_dtype: torch.dtype = torch.bfloat16,
        split_across_ranks: bool = True,
    ) -> None:
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps))
        self.ns_dtype = ns_dtype
        self.split_across_ranks = split_across_ranks
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim != 2:
                    raise ValueError(f"Muon only takes 2-D parameters, got shape {tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D102 - torch.optim API
        for group in self.param_groups:
            # Same-shape matrices (all q_proj of all layers, ...) go through Newton-Schulz as one
            # batched matmul chain: a few large kernels instead of one small chain per matrix.
            by_shape: dict[tuple[int, ...], list[torch.Tensor]] = {}
            for p in group["params"]:
                if p.grad is not None:
                    by_shape.setdefault(tuple(p.shape), []).append(p)
            for shape, params in by_shape.items():
                updates = []
                for p in params:
                    state = self.state[p]
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = torch.zeros_like(p.grad)
                    buf = state["momentum_buffer"]
                    buf.lerp_(p.grad, 1 - group["momentum"])
                    updates.append(full(p.grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf))
                ortho = orthogonalize(torch.stack(updates),
                                      lambda x: newton_schulz(x, group["ns_steps"], self.ns_dtype),  # noqa: B023
                                      self.ns_dtype, split=self.split_across_ranks)
                # Scale so that tall and wide matrices get comparable per-element step sizes.
                scale = max(1.0, shape[-2] / shape[-1]) ** 0.5
                for p, update in zip(params, ortho.unbind(0), strict=True):
                    add_update(p, update, alpha=-group["lr"] * scale)
        return None


def build_optimizers(
    model: nn.Module, cfg: OptimConfig, model_dim: int, ns_dtype: torch.dtype, fused: bool
) -> list[torch.optim.Optimizer]:
    """Muon + AdamW over `model.param_groups()`; each group remembers its base lr as `initial_lr`.

    AdamW learning rates scale as 1/sqrt(d_model / 768), nanochat's rule, so one set of defaults
    works from depth 4 to depth 26.
    """
    groups = model.param_groups()
    dim_scale = (model_dim / 768) ** -0.5
    adam_groups = [
        dict(params=groups["embedding"], lr=cfg.embedding_lr * dim_scale),
        dict(params=groups["lm_head"], lr=cfg.unembedding_lr * dim_scale),
        dict(params=groups["scalar"], lr=cfg.scalar_lr * dim_scale),
    ]
    adam_groups = [g for g in adam_groups if g["params"]]
    # fused needs every param on a fused-capable device; foreach is the portable fast path.
    kwargs = dict(fused=True) if fused else dict(foreach=True)
    adamw = torch.optim.AdamW(adam_groups, betas=cfg.adam_betas, eps=1e-10, weight_decay=cfg.weight_decay, **kwargs)
    muon = Muon(groups["matrix"], lr=cfg.matrix_lr, ns_dtype=ns_dtype)
    optimizers: list[torch.optim.Optimizer] = [adamw, muon]
    for opt in optimizers:
        for group in opt.param_groups:
            group["initial_lr"] = group["lr"]
    return optimizers


def training_optimizers(model: nn.Module, cfg: OptimConfig, dev: Device) -> list[torch.optim.Optimizer]:
    """Muon + AdamW as the Trainer builds them, and so as the batch-size finder and the profiler measure
    them: Newton-Schulz in the device's dtype (`Device.newton_schulz_dtype`, the one rule), AdamW fused
    where the device supports it."""
    return build_optimizers(model, cfg, model.config.n_embd, dev.newton_schulz_dtype, dev.fused_optimizer)
