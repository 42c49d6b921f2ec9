"""The GPT model: configuration, modules, Hugging Face mapping (generation is the engine's: portachat.engine)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from portachat.model.config import ConfigError, GPTConfig, training_tokens
    from portachat.model.gpt import GPT
    from portachat.model.hf import (
        UnsupportedConfigError,
        exportable,
        from_hf_config,
        generation_config,
        to_hf_config,
    )

# Loaded on first use (PEP 562), so importing a light module of the package (config, gguf_names)
# does not load torch: the command line reads its defaults from them.
_HOMES = {
    "ConfigError": "portachat.model.config",
    "GPTConfig": "portachat.model.config",
    "training_tokens": "portachat.model.config",
    "GPT": "portachat.model.gpt",
    **{name: "portachat.model.hf" for name in ("UnsupportedConfigError", "exportable", "from_hf_config",
                                                "generation_config", "to_hf_config")},
}
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


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
