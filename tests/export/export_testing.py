"""Our checkpoints for the export tests (a uniquely named module: every tests/ folder has a conftest)."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from portachat.model import GPT, GPTConfig
from portachat.model.model_dir import save_model_files
from portachat.storage.atomic import atomic_directory

# portachat's previous default split pattern (GPT-4's with 1-2 digit groups): no llama.cpp pre-tokenizer
# splits this way, so a tokenizer trained with it cannot be exported to GGUF.
LEGACY_SPLIT_PATTERN = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""


def make_checkpoint(directory: Path, tokenizer, generation_defaults: dict | None = None,
                    **overrides) -> tuple[Path, GPT]:
    """One of our checkpoints (random weights in every tensor, scaled like a trained net), saved as training saves it."""
    # head_dim 128 (from_depth's default): transformers' GGUF loader ignores attention.key_length for
    # qwen3 and assumes Qwen3Config's default 128.
    base = dict(
        vocab_size=384, n_layer=2, n_embd=256, n_head=2, n_kv_head=1, head_dim=128, intermediate_size=256,
        max_seq_len=128,
    )
    cfg = GPTConfig(**{**base, **overrides})
    model = GPT(cfg)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=generator) / math.sqrt(p.shape[1]))
            else:  # norms around 1, biases around 0
                p.copy_(torch.randn(p.shape, generator=generator) * 0.1 + (0.0 if "bias" in name else 1.0))
    with atomic_directory(directory) as tmp:
        save_model_files(tmp, model, tokenizer, {"stage": "sft", "step": 7}, generation_defaults=generation_defaults)
    return directory, model.eval()
