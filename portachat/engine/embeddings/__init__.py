"""Embeddings: models that map texts to vectors (BERT encoders, decoders pooled), for /v1/embeddings
and document search."""

from portachat.engine.embeddings.config import (
    DEFAULT_POOLING,
    POOLING_MODES,
    PoolingConfig,
    read_pooling_config,
)
from portachat.engine.embeddings.embedder import Embedder, EmbeddingInputError
from portachat.engine.embeddings.load import decoder_embedder, load_embedding_model
from portachat.model.source import is_embedding_model

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
