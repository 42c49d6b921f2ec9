"""The GPT model: configuration, modules, KV cache, generation, Hugging Face mapping."""

from __future__ import annotations

from portachat.model.config import ConfigError, GPTConfig, training_tokens
from portachat.model.generate import generate, sample_next
from portachat.model.gpt import GPT
from portachat.model.hf import (
    UnsupportedConfigError,
    exportable,
    from_hf_config,
    generation_config,
    to_hf_config,
)
from portachat.model.kv_cache import KVCache, KVCacheError

__all__ = [
    "GPT",
    "ConfigError",
    "GPTConfig",
    "KVCache",
    "KVCacheError",
    "UnsupportedConfigError",
    "exportable",
    "from_hf_config",
    "generate",
    "generation_config",
    "sample_next",
    "to_hf_config",
    "training_tokens",
]
