"""A loaded model as everything that serves it sees it: the engine (and its replicas), the chat
tokenizer, the generation defaults, the embedder; built by portachat.engine.loading."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from portachat.engine.async_engine import EngineLike
from portachat.engine.embeddings import Embedder
from portachat.model.load import GenerationDefaults
from portachat.tokenizer.protocol import ChatTokenizer


@dataclass
class ServedModel:
    """A loaded model behind an engine, as the API needs it. An embedding model (e.g. a BERT encoder) has
    no engine and no chat tokenizer: only its embedder."""

    engine: EngineLike | None
    tokenizer: ChatTokenizer | None
    max_model_len: int
    generation_defaults: GenerationDefaults = field(default_factory=GenerationDefaults)  # generation_config.json
    description: str = ""
    bos_for_completions: bool = False  # our own models were trained on BOS-led documents
    replicas: list[EngineLike] = field(default_factory=list)  # --data-parallel-size: engines beside `engine`
    embedder: Embedder | None = None  # POST /v1/embeddings (document search calls embedder.embed_texts)
    failure: Callable[[], str | None] | None = None  # why the model can no longer run (a dead worker)
    close: Callable[[], None] | None = None  # stops what the model runs on (worker processes)
    worker_pids: list[int] = field(default_factory=list)
