"""POST /v1/chat/completions and /v1/completions: request -> prompt ids -> engine -> OpenAI JSON or SSE."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from portachat.engine.async_engine import EngineShutdown, RequestStream
from portachat.engine.structured import StructuredError, StructuredSpec
from portachat.engine.structured.fields import structured_spec
from portachat.engine.types import EngineError, RequestOutput, SamplingParams
from portachat.i18n import _
from portachat.serve.api.documents import ground_chat, with_citations
from portachat.serve.api.errors import APIError, error_body
from portachat.serve.api.owner import request_is_admin
from portachat.serve.api.protocol import ChatCompletionRequest, CompletionRequest, check_supported, parse_body
from portachat.serve.api.sse import SSE_DONE, GuardedStream, sse_event
from portachat.serve.api.state import ModelLease, ServerState
from portachat.serve.api.tool_calls import (
    StreamingToolParser,
    ToolRequest,
    call_format,
    parse_tool_calls,
    template_messages,
    tool_call_spec,
    tool_request,
)


class ClientGone(Exception):
    """The client disconnected before its (non-streamed) answer was ready."""


# ------------------------------------------------------------------------------------------ prompt


def chat_prompt(state: ModelLease, req: ChatCompletionRequest, tools: ToolRequest | None = None) -> list[int]:
    settings = state.settings
    if not req.messages:
        raise APIError(400, "'messages' is empty: send at least one message, e.g. "
                            '[{"role": "user", "content": "Hello"}].', param="messages")
    check_message_count(len(req.messages), settings.max_messages)
    messages = template_messages(req.messages)
    try:
        return state.model.tokenizer.render_prompt(messages, tools=tools.tools if tools else None)
    except Exception as exc:  # noqa: BLE001 - a template's raise_exception or our format's checks
        raise APIError(400, f"The conversation cannot be rendered with this model's chat template: {exc}",
                       param="messages") from None


def check_message_count(count: int, limit: int) -> None:
    """400 past `--max-messages` (chat completions and Anthropic's messages alike)."""
    if count > limit:
        raise APIError(400, _("Too many messages: {count} (this server's limit is {limit}, `portachat serve "
                              "--max-messages`).").format(count=count, limit=limit), param="messages")


def completion_prompt(state: ModelLease, req: CompletionRequest) -> list[int]:
    prompt: Any = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) != 1:
            raise APIError(400, f"Batched prompts are not supported (got {len(prompt)}): send one request per "
                                "prompt; the server batches concurrent requests itself.", param="prompt")
        prompt = prompt[0]
    tokenizer = state.model.tokenizer
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt)
        if state.model.bos_for_completions and tokenizer.bos_id is not None:
            ids = [tokenizer.bos_id, *ids]
    else:
        ids = list(prompt)
        bad = [t for t in ids if not 0 <= t < tokenizer.vocab_size]
        if bad:
            raise APIError(400, f"Token id {bad[0]} is outside this model's vocabulary (0..{tokenizer.vocab_size - 1}).",
                           param="prompt")
    if not ids:
        raise APIError(400, "The prompt is empty: send some text or token ids.", param="prompt")
    return ids


# ------------------------------------------------------------------------------------------ params


def sampling_params(state: ModelLease, req: ChatCompletionRequest | CompletionRequest, prompt_len: int,
                    prompt_param: str) -> SamplingParams:
    """OpenAI fields -> SamplingParams; 400 when the prompt plus max_tokens cannot fit the context."""
    limit = state.model.max_model_len
    if prompt_len >= limit:
        raise APIError(400, f"This model's maximum context length is {limit} tokens, but the {prompt_param} "
                            f"has {prompt_len} tokens. Shorten the {prompt_param}.",
                       param=prompt_param, code="context_length_exceeded")
    max_tokens = req.max_tokens
    param = "max_tokens"
    if isinstance(req, ChatCompletionRequest) and req.max_completion_tokens is not None:
        max_tokens, param = req.max_completion_tokens, "max_completion_tokens"
    if max_tokens is None:
        max_tokens = limit - prompt_len  # as vLLM: whatever room the context leaves
    elif prompt_len + max_tokens > limit:
        raise APIError(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                            f"{prompt_len + max_tokens} tokens ({prompt_len} in the {prompt_param}, {max_tokens} "
                            f"for the completion). Reduce the {prompt_param} or {param} (at most "
                            f"{limit - prompt_len} here).", param=param, code="context_length_exceeded")
    defaults = state.model.generation_defaults
    top_k = req.top_k if req.top_k is not None else defaults.get("top_k", 0)
    if isinstance(req, ChatCompletionRequest):
        logprobs, top_logprobs = bool(req.logprobs), (req.top_logprobs or 0) if req.logprobs else 0
    else:
        logprobs, top_logprobs = req.logprobs is not None, req.logprobs or 0
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=req.temperature if req.temperature is not None else defaults.get("temperature", 1.0),
        top_p=req.top_p if req.top_p is not None else defaults.get("top_p", 1.0),
        top_k=max(0, top_k or 0),
        seed=req.seed,
        stop=req.stop_list(),
        stop_token_ids=list(req.stop_token_ids or []),
        ignore_eos=req.ignore_eos,
        repetition_penalty=req.repetition_penalty if req.repetition_penalty is not None
        else defaults.get("repetition_penalty", 1.0),
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        logprobs=logprobs,
        adapter=state.adapter,
        top_logprobs=top_logprobs,
        logit_bias=logit_bias(state, req),
    )


def logit_bias(state: ModelLease, req: ChatCompletionRequest | CompletionRequest) -> dict[int, float]:
    """logit_bias's string keys -> token ids of this model (check_supported has checked the form and range)."""
    vocab = state.model.tokenizer.vocab_size
    out = {}
    for key, bias in (req.logit_bias or {}).items():
        token = int(key)
        if token >= vocab:
            raise APIError(400, f"Invalid key in 'logit_bias': token id {token} is outside this model's vocabulary "
                                f"(0..{vocab - 1}).", param="logit_bias")
        out[token] = float(bias)
    return out


def output_constraint(req: ChatCompletionRequest | CompletionRequest) -> StructuredSpec | None:
    """response_format / structured_outputs / guided_* -> the engine's constraint; 400 naming the field."""
    try:
        return structured_spec(req)
    except StructuredError as exc:
        raise APIError(400, str(exc), param=exc.param) from None


async def compile_constraint(state: ModelLease, spec: StructuredSpec | None) -> None:
    """Compile a request's constraint on a worker thread before it reaches the engine loop (a 400
    naming the part llguidance cannot handle), where the engine offers it."""
    compile_ = getattr(state.model.engine, "compile_constraint", None)
    if spec is None or compile_ is None:
        return
    try:
        await run_in_threadpool(compile_, spec)
    except StructuredError as exc:
        raise APIError(400, str(exc), param=exc.param) from None
    except EngineError as exc:  # llguidance is not installed
        raise APIError(500, str(exc), code="engine_error") from None


# ------------------------------------------------------------------------------------------ engine


async def submit(state: ModelLease, prompt_ids: list[int], params: SamplingParams, request_id: str,
                 max_tokens_param: str) -> RequestStream:
    try:
        return await state.engine.add(prompt_ids, params, request_id)
    except EngineError as exc:
        if exc.kind == "queue_full":
            raise APIError(429, f"The server is at capacity ({exc}). Retry after a short wait, or start the server "
                                "with a larger `portachat serve --max-waiting`.", code="queue_full") from None
        if exc.kind == "too_long":
            raise APIError(400, str(exc), param=max_tokens_param, code="context_length_exceeded") from None
        if exc.kind == "invalid":  # a structured-output error names the request field it came from
            raise APIError(400, str(exc), param=getattr(exc, "param", None)) from None
        raise APIError(500, str(exc), code="engine_error") from None
    except EngineShutdown as exc:
        raise APIError(503, f"{exc}. Retry against another replica or after the restart.",
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


def abort_all(handles: list[RequestStream]):
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

    def add(self, output: RequestOutput) -> None:
        self.text += output.text
        self.token_ids += output.token_ids
        self.logprobs += _logprobs_of(output)
        self.top_logprobs += _tops_of(output)
        if output.finished:
            self.finish_reason = output.finish_reason
            self.error = output.error
            self.stop_string = output.stop_string


def _logprobs_of(output: RequestOutput) -> list[float | None]:
    values = list(output.logprobs or [])
    return values + [None] * (len(output.token_ids) - len(values))  # forced tool tokens have none


def _tops_of(output: RequestOutput) -> list[list[tuple[int, float]]]:
    values = list(output.top_logprobs or [])
    return values + [[] for _ in range(len(output.token_ids) - len(values))]


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
    return APIError(500, output_error or "the engine failed on this request", code="engine_error")


# ------------------------------------------------------------------------------------------ responses


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _token_text(state: ModelLease, token_id: int) -> tuple[str, list[int]]:
    raw = state.model.tokenizer.token_bytes(token_id)
    try:
        return raw.decode("utf-8"), list(raw)
    except UnicodeDecodeError:  # part of a character split across tokens: show bytes, as vLLM does
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw), list(raw)


def chat_logprobs(state: ModelLease, token_ids: list[int], logprobs: list[float | None],
                  tops: list[list[tuple[int, float]]] | None = None) -> dict[str, Any]:
    content = []
    for i, (token_id, lp) in enumerate(zip(token_ids, logprobs, strict=True)):
        token, raw = _token_text(state, token_id)
        alternatives = []
        for alt_id, alt_lp in (tops[i] if tops else []):
            alt, alt_raw = _token_text(state, alt_id)
            alternatives.append({"token": alt, "logprob": alt_lp, "bytes": alt_raw})
        content.append({"token": token, "logprob": lp if lp is not None else 0.0, "bytes": raw,
                        "top_logprobs": alternatives})
    return {"content": content}


def completion_logprobs(state: ModelLease, token_ids: list[int], logprobs: list[float | None],
                        offset: int, tops: list[list[tuple[int, float]]] | None = None) -> dict[str, Any]:
    """OpenAI's legacy shape; top_logprobs (with logprobs=k > 0) maps each alternative's text to its logprob."""
    tokens, offsets = [], []
    for token_id in token_ids:
        token, _ = _token_text(state, token_id)
        tokens.append(token)
        offsets.append(offset)
        offset += len(state.model.tokenizer.decode([token_id]))
    top = None
    if tops is not None:
        top = [{_token_text(state, alt_id)[0]: alt_lp for alt_id, alt_lp in step} for step in tops]
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": top, "text_offset": offsets}


async def merged(streams: list[AsyncIterator[Any]]) -> AsyncIterator[Any]:
    """Items of several async iterators as they come, each one's in its own order (the choices of an
    n > 1 stream interleave as their tokens arrive)."""
    queue: asyncio.Queue = asyncio.Queue()
    end = object()

    async def pump(stream: AsyncIterator[Any]) -> None:
        try:
            async for item in stream:
                await queue.put((item, None))
            await queue.put((end, None))
        except Exception as exc:  # noqa: BLE001 - re-raised in the consumer
            await queue.put((end, exc))

    tasks = [asyncio.ensure_future(pump(s)) for s in streams]
    try:
        left = len(tasks)
        while left:
            item, exc = await queue.get()
            if exc is not None:
                raise exc
            if item is end:
                left -= 1
                continue
            yield item
    finally:
        for task in tasks:
            task.cancel()


def _engine_error_event(output: RequestOutput) -> bytes:
    """The SSE error event of a request the engine failed (OpenAI's error shape, 500)."""
    message = output.error or "the engine failed on this request"
    return sse_event(error_body(500, message, code="engine_error"))


async def _stream_choices(choices: list[AsyncIterator[tuple[bytes, bool]]],
                          final_usage: Callable[[], dict] | None) -> AsyncIterator[bytes]:
    """The choices' events interleaved; an error event ends the stream; then the usage chunk (when
    asked for) and [DONE]."""
    async for event, is_error in (choices[0] if len(choices) == 1 else merged(choices)):
        yield event
        if is_error:
            yield SSE_DONE
            return
    if final_usage is not None:
        yield sse_event(final_usage())
    yield SSE_DONE


async def with_lease(request: Request, req: Any, respond) -> Response:
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


async def chat_completions(request: Request) -> Response:
    req = parse_body(await request.body(), ChatCompletionRequest)
    check_supported(req)
    return await with_lease(request, req, _chat_completions)


async def _chat_completions(request: Request, state: ModelLease, req: ChatCompletionRequest) -> Response:
    citations = await ground_chat(request, req, state)  # vendor field `documents`: passages into the messages
    tools = tool_request(req.tools, req.tool_choice, req.parallel_tool_calls)
    call_fmt = call_format(getattr(state.model.tokenizer, "chat_template", None)) if tools and tools.parse_calls else None
    constraint = output_constraint(req)
    enforced_calls = tool_call_spec(tools, call_fmt)
    if constraint is not None and enforced_calls is not None:
        raise APIError(400, f"tool_choice {req.tool_choice!r} and {constraint.param.split('.')[0]} both constrain "
                            "the reply: send one of them.", param="tool_choice")
    prompt_ids = await run_in_threadpool(chat_prompt, state, req, tools)
    max_param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    params = sampling_params(state, req, len(prompt_ids), "messages")
    params.structured = constraint or enforced_calls
    await compile_constraint(state, params.structured)
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    handles = await submit_n(state, prompt_ids, params, request_id, max_param, req.n)
    if req.stream:
        options = req.stream_options
        return GuardedStream(with_citations(
            _chat_stream(state, handles, request_id, created, len(prompt_ids), req.logprobs,
                         bool(options and options.include_usage), bool(options and options.continuous_usage_stats),
                         call_fmt, tools.parallel if tools else True), citations),
            on_close=abort_all(handles),
        )
    results = await finished_results(request, handles)
    choices = [_chat_choice(state, i, result, req.logprobs, call_fmt, tools) for i, result in enumerate(results)]
    return JSONResponse({
        "id": request_id, "object": "chat.completion", "created": created, "model": state.model_name,
        "choices": choices, "usage": _usage(len(prompt_ids), sum(len(r.token_ids) for r in results)),
        **({"citations": citations} if citations is not None else {}),
    })


def _chat_choice(state: ModelLease, index: int, result: Collected, logprobs: bool, call_fmt: str | None,
                 tools: ToolRequest | None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": result.text}
    finish_reason = result.finish_reason
    if call_fmt is not None:
        content, calls = parse_tool_calls(result.text, call_fmt)
        if calls:
            calls = calls if tools.parallel else calls[:1]
            message = {"role": "assistant", "content": content or None,
                       "tool_calls": [c.openai() for c in calls]}
            finish_reason = "tool_calls"
    return {
        "index": index,
        "message": message,
        "logprobs": chat_logprobs(state, result.token_ids, result.logprobs, result.top_logprobs) if logprobs else None,
        "finish_reason": finish_reason,
    }


async def _chat_stream(state: ModelLease, handles: list[RequestStream], request_id: str, created: int,
                       prompt_len: int, logprobs: bool, include_usage: bool, continuous_usage: bool,
                       call_fmt: str | None = None, parallel_calls: bool = True) -> AsyncIterator[bytes]:
    base = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": state.model_name}
    completion_tokens = 0  # over every choice; the prompt counts once

    def chunk(index: int, delta: dict, finish_reason: str | None = None, lp: dict | None = None) -> bytes:
        payload = {**base, "choices": [{"index": index, "delta": delta, "logprobs": lp,
                                        "finish_reason": finish_reason}]}
        if include_usage:  # OpenAI: null on every chunk but the last
            payload["usage"] = _usage(prompt_len, completion_tokens) if continuous_usage else None
        return sse_event(payload)

    async def choice(index: int, handle: RequestStream) -> AsyncIterator[tuple[bytes, bool]]:
        """One choice's events, each with whether it is an error (which ends the whole stream)."""
        nonlocal completion_tokens
        calls = StreamingToolParser(call_fmt) if call_fmt is not None else None
        sent_calls = 0

        def call_chunks(found: list) -> list[bytes]:
            # OpenAI streams a call as its id and name first, then the arguments.
            nonlocal sent_calls
            out = []
            for call in found:
                if sent_calls and not parallel_calls:
                    break
                head = {"index": sent_calls, "id": call.id, "type": "function",
                        "function": {"name": call.name, "arguments": ""}}
                out.append(chunk(index, {"tool_calls": [head]}))
                out.append(chunk(index, {"tool_calls": [{"index": sent_calls,
                                                         "function": {"arguments": call.arguments}}]}))
                sent_calls += 1
            return out

        yield chunk(index, {"role": "assistant", "content": ""}), False
        async for output in handle:
            completion_tokens += len(output.token_ids)
            text, found = calls.feed(output.text) if calls is not None else (output.text, [])
            if output.finished and calls is not None and output.finish_reason != "error":
                rest, more = calls.finish()
                text, found = text + rest, found + more
            if text or (logprobs and output.token_ids):  # held-back bytes: nothing to show yet
                lp = chat_logprobs(state, output.token_ids, _logprobs_of(output), _tops_of(output)) \
                    if logprobs else None
                yield chunk(index, {"content": text}, lp=lp), False
            for piece in call_chunks(found):
                yield piece, False
            if output.finished:
                if output.finish_reason == "error":
                    yield _engine_error_event(output), True
                    return
                yield chunk(index, {}, "tool_calls" if sent_calls else output.finish_reason), False

    def final_usage() -> dict:  # read after every choice has finished
        return {**base, "choices": [], "usage": _usage(prompt_len, completion_tokens)}

    async for event in _stream_choices([choice(i, h) for i, h in enumerate(handles)],
                                       final_usage if include_usage else None):
        yield event


async def completions(request: Request) -> Response:
    req = parse_body(await request.body(), CompletionRequest)
    check_supported(req)
    return await with_lease(request, req, _completions)


async def _completions(request: Request, state: ModelLease, req: CompletionRequest) -> Response:
    constraint = output_constraint(req)
    prompt_ids = await run_in_threadpool(completion_prompt, state, req)
    params = sampling_params(state, req, len(prompt_ids), "prompt")
    params.structured = constraint
    await compile_constraint(state, constraint)
    request_id = f"cmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    echo = ""
    if req.echo:  # the prompt as sent; token-id prompts as decoded text
        text = req.prompt[0] if isinstance(req.prompt, list) and len(req.prompt) == 1 else req.prompt
        echo = text if isinstance(text, str) else state.model.tokenizer.decode(prompt_ids)
    handles = await submit_n(state, prompt_ids, params, request_id, "max_tokens", req.n)
    want_logprobs = req.logprobs is not None
    want_tops = bool(req.logprobs)
    if req.stream:
        options = req.stream_options
        return GuardedStream(
            _completion_stream(state, handles, request_id, created, len(prompt_ids), echo, want_logprobs, want_tops,
                               bool(options and options.include_usage),
                               bool(options and options.continuous_usage_stats)),
            on_close=abort_all(handles),
        )
    results = await finished_results(request, handles)
    choices = [{
        "index": i,
        "text": echo + result.text,
        "logprobs": completion_logprobs(state, result.token_ids, result.logprobs, len(echo),
                                        result.top_logprobs if want_tops else None) if want_logprobs else None,
        "finish_reason": result.finish_reason,
    } for i, result in enumerate(results)]
    return JSONResponse({
        "id": request_id, "object": "text_completion", "created": created, "model": state.model_name,
        "choices": choices, "usage": _usage(len(prompt_ids), sum(len(r.token_ids) for r in results)),
    })


async def _completion_stream(state: ModelLease, handles: list[RequestStream], request_id: str, created: int,
                             prompt_len: int, echo: str, logprobs: bool, tops: bool, include_usage: bool,
                             continuous_usage: bool) -> AsyncIterator[bytes]:
    base = {"id": request_id, "object": "text_completion", "created": created, "model": state.model_name}
    completion_tokens = 0  # over every choice; the prompt counts once

    def chunk(index: int, text: str, finish_reason: str | None = None, lp: dict | None = None) -> bytes:
        payload = {**base, "choices": [{"index": index, "text": text, "logprobs": lp,
                                        "finish_reason": finish_reason}]}
        if include_usage:
            payload["usage"] = _usage(prompt_len, completion_tokens) if continuous_usage else None
        return sse_event(payload)

    async def choice(index: int, handle: RequestStream) -> AsyncIterator[tuple[bytes, bool]]:
        """One choice's events, each with whether it is an error (which ends the whole stream)."""
        nonlocal completion_tokens
        offset = len(echo)
        if echo:
            yield chunk(index, echo), False
        async for output in handle:
            completion_tokens += len(output.token_ids)
            if output.text or (logprobs and output.token_ids):
                lp = completion_logprobs(state, output.token_ids, _logprobs_of(output), offset,
                                         _tops_of(output) if tops else None) if logprobs else None
                offset += len(output.text)
                yield chunk(index, output.text, lp=lp), False
            if output.finished:
                if output.finish_reason == "error":
                    yield _engine_error_event(output), True
                    return
                yield chunk(index, "", output.finish_reason), False

    def final_usage() -> dict:  # read after every choice has finished
        return {**base, "choices": [], "usage": _usage(prompt_len, completion_tokens)}

    async for event in _stream_choices([choice(i, h) for i, h in enumerate(handles)],
                                       final_usage if include_usage else None):
        yield event
