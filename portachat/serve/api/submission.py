"""A request's trip through the engine: submit (n choices fan out over one prompt), collect the
replies unless the client leaves, and hold the model's lease for as long as the request runs."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from portachat.engine.async_engine import EngineShutdown, RequestStream
from portachat.engine.scoring import PromptScores, prompt_top_logprobs
from portachat.engine.types import EngineError, RequestOutput, SamplingParams
from portachat.engine.workers.data_parallel import DataParallelEngine
from portachat.i18n import _
from portachat.serve.api.errors import APIError
from portachat.serve.api.owner import request_is_admin
from portachat.serve.api.reply_shapes import logprobs_of, tops_of
from portachat.serve.api.sse import GuardedStream
from portachat.serve.api.state import ModelLease, ServerState


class ClientGone(Exception):
    """The client disconnected before its (non-streamed) answer was ready."""


async def submit(state: ModelLease, prompt_ids: list[int], params: SamplingParams, request_id: str,
                 max_tokens_param: str) -> RequestStream:
    try:
        return await state.engine.add(prompt_ids, params, request_id)
    except EngineError as exc:
        raise _refusal(exc, max_tokens_param) from None
    except EngineShutdown as exc:
        raise APIError(503, _("{exc}. Retry against another replica or after the restart.").format(exc=exc),
                       code="shutting_down") from None


def _refusal(exc: EngineError, too_long_param: str) -> APIError:
    if exc.kind == "queue_full":
        return APIError(429, _("The server is at capacity ({exc}). Retry after a short wait, or start the "
                               "server with a larger `portachat serve --max-waiting`.").format(exc=exc),
                        code="queue_full")
    if exc.kind == "too_long":
        return APIError(400, str(exc), param=too_long_param, code="context_length_exceeded")
    if exc.kind == "invalid":  # a structured-output error names the request field it came from
        return APIError(400, str(exc), param=getattr(exc, "param", None))
    return APIError(500, str(exc), code="engine_error")


async def score_prompt(state: ModelLease, prompt_ids: list[int], k: int) -> PromptScores:
    """The prompt's top-k log-probabilities at every position (one forward, between engine steps, on one
    replica: every replica holds the same weights)."""
    engine = state.engine
    first = engine.replicas[0] if isinstance(engine, DataParallelEngine) else engine
    try:
        return await first.call(lambda e: prompt_top_logprobs(e, prompt_ids, k, state.adapter))
    except EngineError as exc:
        raise _refusal(exc, "prompt") from None
    except EngineShutdown as exc:
        raise APIError(503, _("{exc}. Retry against another replica or after the restart.").format(exc=exc),
                       code="shutting_down") from None


async def submit_n(state: ModelLease, prompt_ids: list[int], params: SamplingParams, request_id: str,
                   max_tokens_param: str, n: int) -> list[RequestStream]:
    """The n choices of one request as n engine requests over the same prompt ids: the scheduler admits
    the later ones once the first has computed the prompt, so they take its KV blocks from the prefix
    cache. Choice i is seeded with seed + i (vLLM's rule), so a seeded request is reproducible and
    its choices differ."""
    if n == 1:
        return [await submit(state, prompt_ids, params, request_id, max_tokens_param)]
    handles: list[RequestStream] = []
    try:
        for i in range(n):
            seed = params.seed + i if params.seed is not None else None
            handles.append(await submit(state, prompt_ids, replace(params, seed=seed), f"{request_id}-{i}",
                                        max_tokens_param))
    except BaseException:
        for handle in handles:
            handle.abort()
        raise
    return handles


def abort_all(handles: list[RequestStream]) -> Callable[[], None]:
    """A callback that aborts every choice (a stream's on_close, the end of a collected reply)."""

    def abort() -> None:
        for handle in handles:
            handle.abort()
    return abort


@dataclass
class Collected:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None
    stop_string: str | None = None
    # Each output's (text, token ids), so a whole reply is split exactly as its stream would be.
    pieces: list[tuple[str, list[int]]] = field(default_factory=list)

    def add(self, output: RequestOutput) -> None:
        self.pieces.append((output.text, list(output.token_ids)))
        self.text += output.text
        self.token_ids += output.token_ids
        self.logprobs += logprobs_of(output)
        self.top_logprobs += tops_of(output)
        if output.finished:
            self.finish_reason = output.finish_reason
            self.error = output.error
            self.stop_string = output.stop_string

async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def collect(request: Request, handle: RequestStream) -> Collected:
    """Run a request to the end, unless its client goes away first (then abort it and raise ClientGone)."""
    return (await collect_all(request, [handle]))[0]


async def collect_all(request: Request, handles: list[RequestStream]) -> list[Collected]:
    """Run a request's choices to the end together, unless the client goes away first (ClientGone)."""

    async def consume_one(handle: RequestStream) -> Collected:
        result = Collected()
        async for output in handle:
            result.add(output)
        return result

    async def consume() -> list[Collected]:
        return list(await asyncio.gather(*(consume_one(h) for h in handles)))

    work = asyncio.ensure_future(consume())
    gone = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not work.done():
            work.cancel()
    if work.cancelled():
        raise ClientGone
    return work.result()


async def finished_results(request: Request, handles: list[RequestStream]) -> list[Collected]:
    """Every choice run to its end (the engine's requests freed however it ends); a choice the
    engine failed is a 500 for the whole reply."""
    try:
        results = await collect_all(request, handles)
    finally:
        abort_all(handles)()
    for result in results:
        if result.finish_reason == "error":
            raise _error_for(result.error)
    return results


def _error_for(output_error: str | None) -> APIError:
    return APIError(500, output_error or _("the engine failed on this request"), code="engine_error")

async def with_lease(request: Request, req: Any,
                     respond: Callable[[Request, ModelLease, Any], Awaitable[Response]]) -> Response:
    """Run `respond(request, state, req)` holding a lease on the model the request names; a streamed
    response releases it when the stream closes, anything else when `respond` returns or raises."""
    server: ServerState = request.app.state.server
    state = await server.acquire(req.model, req.keep_alive, admin=request_is_admin(request))
    response = None
    try:
        response = await respond(request, state, req)
        return response
    finally:
        if isinstance(response, GuardedStream):
            response.also_on_close(state.release)
        else:
            state.release()
