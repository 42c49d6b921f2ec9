"""Tiny models for the model tests (a uniquely named module: every tests/ folder has a conftest)."""

from __future__ import annotations

import torch

from portachat.model import GPT, GPTConfig


def tiny_config(**overrides) -> GPTConfig:
    """2 layers, width 64, 4 query heads over 2 kv heads (GQA), head_dim 16, vocab 128."""
    base = dict(
        vocab_size=128, n_layer=2, n_embd=64, n_head=4, n_kv_head=2, head_dim=16, intermediate_size=160
    )
    base.update(overrides)
    return GPTConfig(**base)


def randomized(model: GPT, seed: int = 0, std: float = 0.3) -> GPT:
    """Give every weight (norms and zero-initialised projections included) a random value, so that
    parity tests exercise all of them rather than an identity-like freshly initialised network."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * std + (1.0 if p.dim() == 1 else 0.0))
    return model.eval()
