"""Bytes one decode step must read from memory: the numerator of model-bandwidth utilisation (MBU).

Every weight once, as stored (bf16, int8 codes and scales, packed int4), except an untied input
embedding table: a step looks up one row per sequence, not the table (counting the table would
flatter MBU by vocab x width bytes, a quarter of a small model). Plus each sequence's KV cache so far.
"""

from __future__ import annotations

import torch

from portachat.model import GPT
from portachat.ops.kv_quant import bytes_per_token
from portachat.quant.apply import weight_bytes


def decode_read_bytes(model: GPT, batch: int, context: float, kv_dtype: torch.dtype) -> float:
    """Bytes a decode step of `batch` sequences, each `context` tokens long, reads."""
    cfg = model.config
    total = weight_bytes(model)
    if not cfg.tie_embeddings:  # a tied table is also the output head, which reads all of it
        table = weight_bytes(model.model.embed_tokens)
        total += batch * table / cfg.vocab_size - table
    kv = bytes_per_token(cfg.n_layer, cfg.n_kv_head, cfg.head_dim, kv_dtype)  # int8/fp8: scales included
    return total + batch * context * kv
