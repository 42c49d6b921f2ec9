"""A file into a vector store (extract, chunk, embed, store) and a query against one: the steps the
server's routes and `portachat docs` share. The embedding model comes in as a TextEmbedder, so the
server can embed through its batching queue and the CLI through a model it loaded itself."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from portachat.engine.embeddings import Embedder
from portachat.i18n import _
from portachat.serve.docs.chunking import chunk_text
from portachat.serve.docs.extract import ExtractError, extract_text
from portachat.serve.docs.store import DocStore, Hit, StoreError

EMBED_BATCH = 64  # chunks per embedding call: progress is reported between calls
MAX_CHUNK_TOKENS = 256  # longer passages dilute the vector (all-MiniLM-L6-v2 was trained on <= 128)


@dataclass
class TextEmbedder:
    """An embedding model as document search uses it."""

    name: str  # recorded with the collection: it must be searched with the same model
    embed: Callable[[list[str]], torch.Tensor]  # texts -> [N, D] vectors
    count: Callable[[str], int]  # tokens of a text, special tokens excluded
    max_tokens: int  # per chunk

    def unit_vectors(self, texts: list[str]) -> np.ndarray:
        return F.normalize(self.embed(texts).float(), p=2, dim=-1).numpy()


def text_embedder(embedder: Embedder, name: str,
                  embed: Callable[[list[str]], torch.Tensor] | None = None) -> TextEmbedder:
    """Document search over `embedder` (its own forward unless `embed` is given, e.g. the server's queue)."""
    room = embedder.max_tokens - len(embedder.prefix) - len(embedder.suffix)
    return TextEmbedder(name, embed or embedder.embed_texts, lambda text: len(embedder.encode(text)),
                        max(8, min(MAX_CHUNK_TOKENS, room)))


def chunking_strategy(model: TextEmbedder) -> dict:
    """OpenAI's description of how files were chunked (its `static` strategy's fields)."""
    return {"type": "static", "static": {"max_chunk_size_tokens": model.max_tokens,
                                         "chunk_overlap_tokens": model.max_tokens // 6}}


def attach_file(store: DocStore, store_id: str, file_id: str, model: TextEmbedder,
                progress: Callable[[int, int], None] | None = None) -> dict:
    """Chunk and embed the file into the vector store; its row (status completed, or failed with
    last_error for a file whose text cannot be read). Nothing is stored until every chunk is embedded."""
    store.store(store_id)
    meta = store.file(file_id)
    try:
        text = extract_text(meta["filename"], store.file_bytes(file_id))
    except ExtractError as exc:
        return store.put_failed(store_id, file_id, exc.code, str(exc))
    chunks = chunk_text(text, model.max_tokens, model.max_tokens // 6, model.count)
    if not chunks:
        return store.put_failed(store_id, file_id, "invalid_file", _("{file}: no text found").format(file=meta["filename"]))
    parts = []
    for start in range(0, len(chunks), EMBED_BATCH):
        parts.append(model.unit_vectors([c.text for c in chunks[start:start + EMBED_BATCH]]))
        if progress is not None:
            progress(min(start + EMBED_BATCH, len(chunks)), len(chunks))
    return store.put_chunks(store_id, file_id, chunks, np.concatenate(parts), model.name, chunking_strategy(model))


def search(store: DocStore, store_id: str, query: str, model: TextEmbedder, k: int) -> list[Hit]:
    """The k passages of the vector store nearest the query, best first."""
    if not query.strip():
        raise StoreError(_("The query is empty: send some text to search for."), status=400, param="query")
    row = store.store(store_id)
    if row["dimensions"] is None:
        return []  # nothing attached yet
    vector = model.unit_vectors([query])[0]
    store.check_model(store_id, model.name, int(vector.shape[0]))
    return store.search(store_id, vector, k, text=query)
