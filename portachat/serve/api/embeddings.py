"""POST /v1/embeddings in OpenAI's shape: `input` as a string, strings, token ids or lists of token ids;
`encoding_format` float or base64 (little-endian float32, as OpenAI's clients decode it); `dimensions`
for models trained for shorter vectors; usage counts the tokens embedded, special tokens included."""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Literal

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, StrictInt
from starlette.concurrency import run_in_threadpool

from portachat.engine.embeddings import Embedder, EmbeddingInputError
from portachat.i18n import _
from portachat.serve.api.errors import APIError
from portachat.serve.api.owner import request_is_admin
from portachat.serve.api.protocol import parse_body
from portachat.serve.api.state import ModelLease, ServerState

MAX_INPUTS = 2048  # OpenAI's limit on inputs per request


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    input: str | list[str] | list[StrictInt] | list[list[StrictInt]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    keep_alive: str | float | None = None  # Ollama's: how long the model stays loaded afterwards


def input_ids(embedder: Embedder, value: str | list) -> list[list[int]]:
    """The request's inputs as token ids with the model's special tokens; 400 for empty ones."""
    if isinstance(value, str):
        value = [value]
    if not value:
        raise APIError(400, _("'input' is empty: send a string, a list of strings, or token ids."),
                       param="input")
    if isinstance(value[0], int):
        value = [value]  # one input given as token ids
    if len(value) > MAX_INPUTS:
        raise APIError(400, _("Too many inputs: {count} (at most {limit} per request).").format(
                              count=len(value), limit=MAX_INPUTS), param="input")
    out = []
    for i, item in enumerate(value):
        if not item:
            raise APIError(400, _("Input {i} is empty: every input needs some text or token ids.").format(i=i),
                           param="input")
        out.append(embedder.tokenize(item) if isinstance(item, str) else embedder.with_special_tokens(list(item)))
    return out


def _encode(vector: list[float] | bytes, encoding_format: str) -> list[float] | str:
    return base64.b64encode(vector).decode("ascii") if encoding_format == "base64" else vector


async def embeddings(request: Request) -> Response:
    server: ServerState = request.app.state.server
    arrival = time.monotonic()
    req = parse_body(await request.body(), EmbeddingRequest)
    state = await server.acquire(req.model, req.keep_alive, generation=False, admin=request_is_admin(request))
    try:
        return await _embed(state, req, arrival)
    finally:
        state.release()


async def _embed(state: ModelLease, req: EmbeddingRequest, arrival: float) -> Response:
    embedder = state.embedder
    if embedder is None:
        raise APIError(400, _("The model '{model_name}' does not make embeddings.").format(
                              model_name=state.model_name), param="model",
                       code="model_not_supported")
    try:
        embedder.check_dimensions(req.dimensions)
    except EmbeddingInputError as exc:
        raise APIError(400, str(exc), param="dimensions", code="invalid_value") from None
    ids = await run_in_threadpool(input_ids, embedder, req.input)
    try:
        embedder.check_inputs(ids)
    except EmbeddingInputError as exc:
        raise APIError(400, str(exc), param="input", code=exc.code) from None
    assert state.embedding_queue is not None  # set with the embedder
    vectors = await asyncio.wrap_future(state.embedding_queue.submit(ids, req.dimensions))
    tokens = sum(len(x) for x in ids)
    metrics, name = state.metrics, state.model_name  # as vLLM counts pooling requests
    metrics.prompt_tokens.labels(name).inc(tokens)
    metrics.success.labels(name, "stop").inc()
    metrics.e2e.labels(name).observe(time.monotonic() - arrival)
    if req.encoding_format == "base64":
        rows = [row.numpy().astype("<f4").tobytes() for row in vectors]
    else:
        rows = vectors.tolist()
    return JSONResponse({
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": _encode(row, req.encoding_format)}
                 for i, row in enumerate(rows)],
        "model": state.model_name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })
