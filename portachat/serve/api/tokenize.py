"""POST /tokenize in vLLM's shape: a text -> the served model's token ids, with the context length.

Clients use it to count tokens and to check that they share the server's vocabulary (a distillation
run's remote teacher does: `portachat distill --teacher http://HOST:PORT`)."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict
from starlette.concurrency import run_in_threadpool

from portachat.serve.api.protocol import parse_body
from portachat.serve.api.state import ModelLease
from portachat.serve.api.submission import with_lease


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True  # the BOS a completion prompt gets (vLLM's default: true)
    keep_alive: str | float | None = None  # Ollama's: how long the model stays loaded afterwards


class TokenizeReply(BaseModel):
    tokens: list[int]
    count: int
    max_model_len: int


async def tokenize(request: Request) -> Response:
    return await with_lease(request, parse_body(await request.body(), TokenizeRequest), _tokenize)


async def _tokenize(request: Request, state: ModelLease, req: TokenizeRequest) -> Response:
    tokenizer = state.model.tokenizer
    ids = await run_in_threadpool(tokenizer.encode, req.prompt)
    if req.add_special_tokens and state.model.bos_for_completions and tokenizer.bos_id is not None:
        ids = [tokenizer.bos_id, *ids]  # as /v1/completions encodes a text prompt
    return JSONResponse({"tokens": list(ids), "count": len(ids), "max_model_len": state.model.max_model_len})
