"""Embeddings: models that map texts to vectors (BERT encoders, decoders pooled), for /v1/embeddings
and document search."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from portachat.engine.embeddings.config import (
        DEFAULT_POOLING,
        POOLING_MODES,
        PoolingConfig,
        read_pooling_config,
    )
    from portachat.engine.embeddings.embedder import Embedder, EmbeddingInputError
    from portachat.engine.embeddings.load import decoder_embedder, load_embedding_model
    from portachat.model.source import is_embedding_model

# Loaded on first use (PEP 562): `modes` stays torch-free for the command line's --help.
_HOMES = {
    **{name: "portachat.engine.embeddings.config" for name in ("DEFAULT_POOLING", "POOLING_MODES", "PoolingConfig",
                                                                "read_pooling_config")},
    "Embedder": "portachat.engine.embeddings.embedder",
    "EmbeddingInputError": "portachat.engine.embeddings.embedder",
    "decoder_embedder": "portachat.engine.embeddings.load",
    "load_embedding_model": "portachat.engine.embeddings.load",
    "is_embedding_model": "portachat.model.source",
}
__all__ = [
    "DEFAULT_POOLING",
    "POOLING_MODES",
    "Embedder",
    "EmbeddingInputError",
    "PoolingConfig",
    "decoder_embedder",
    "is_embedding_model",
    "load_embedding_model",
    "read_pooling_config",
]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
