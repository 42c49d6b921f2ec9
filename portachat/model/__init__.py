"""The GPT model: configuration, modules, Hugging Face mapping (generation is the engine's: portachat.engine)."""

from __future__ import annotations

from portachat.model.config import ConfigError, GPTConfig, training_tokens
from portachat.model.gpt import GPT
from portachat.model.hf import (
    UnsupportedConfigError,
    exportable,
    from_hf_config,
    generation_config,
    to_hf_config,
)

__all__ = [
    "GPT",
    "ConfigError",
    "GPTConfig",
    "UnsupportedConfigError",
    "exportable",
    "from_hf_config",
    "generation_config",
    "to_hf_config",
    "training_tokens",
]
