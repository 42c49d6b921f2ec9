"""OpenAI's Responses API over the same engine as chat completions:
    POST   /v1/responses                         create (string or item input, instructions,
                                                 previous_response_id, function tools, text.format, stream)
    GET    /v1/responses/{id}                    a stored response
    DELETE /v1/responses/{id}                    forget it
    GET    /v1/responses/{id}/input_items        the items it was given (limit, order, after)

A request becomes a chat completions request (response_items.py translates the items), so the chat
template, sampling, tool-call formats and structured output are the chat route's own. Reasoning is
split off first (reasoning.py), then tool calls are parsed from the answer. Stored responses
(`store`, true by default as in OpenAI) live under PORTACHAT_HOME/responses and belong to the API key
that made them (response_store.py): another key gets 403, a missing id 404."""

from __future__ import annotations

import time
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool

from portachat.i18n import _
from portachat.serve.api.calculator_steps import ReplySplitter, split_reply
from portachat.serve.api.errors import APIError
from portachat.serve.api.owner import request_owner
from portachat.serve.api.prompt import chat_prompt
from portachat.serve.api.protocol import ChatCompletionRequest, parse_body
from portachat.serve.api.reasoning import after_reasoning, thinking_of
from portachat.serve.api.request_params import compile_constraint, output_constraint, sampling_params
from portachat.serve.api.response_events import response_events
from portachat.serve.api.response_items import (
    chat_messages,
    chat_tool_choice,
    function_tools,
    new_id,
    normalised_input,
    output_items,
    text_format,
)
from portachat.serve.api.response_store import ResponseStore, StoredResponse
from portachat.serve.api.sse import GuardedStream
from portachat.serve.api.state import ModelLease
from portachat.serve.api.submission import collect, submit, with_lease
from portachat.serve.api.tool_calls import call_format, parse_tool_calls, tool_call_spec, tool_request

MAX_INPUT_ITEMS_PAGE = 100  # OpenAI's bound on input_items' `limit`


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    input: str | list[Any]
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    max_output_tokens: int | None = Field(None, json_schema_extra={"minimum": 1})
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # vLLM extension
    seed: int | None = None  # vLLM extension
    metadata: dict[str, str] | None = None
    user: str | None = None
    keep_alive: str | float | None = None  # Ollama's: how long the model stays loaded afterwards
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM extension, e.g. {"enable_thinking": false}


def response_store(request: Request) -> ResponseStore:
    """The app's store under PORTACHAT_HOME/responses, opened on first use."""
    store = getattr(request.app.state, "response_store", None)
    if store is None:
        store = request.app.state.response_store = ResponseStore()
    return store


def _not_found(response_id: str) -> APIError:
    return APIError(404, _("No stored response '{id}': it was never stored (store: false), was deleted, or the "
                           "server dropped it as its oldest.").format(id=response_id), param="response_id",
                    code="not_found")


async def _check_owner(request: Request, response_id: str) -> ResponseStore:
    """404 when there is no such stored response, 403 when another API key made it (no body is read)."""
    store = response_store(request)
    owner = await run_in_threadpool(store.owner_of, response_id)
    if owner is None:
        raise _not_found(response_id)
    if owner != request_owner(request):
        raise APIError(403, _("The response '{id}' belongs to another API key; each key sees only the responses it "
                              "made.").format(id=response_id), param="response_id", code="permission_denied")
    return store


async def _owned(request: Request, response_id: str) -> StoredResponse:
    """The stored response when the request's API key made it; 404 when there is none, else 403."""
    store = await _check_owner(request, response_id)
    stored = await run_in_threadpool(store.get, response_id)
    if stored is None:  # deleted between the two reads
        raise _not_found(response_id)
    return stored


def as_chat_request(req: ResponsesRequest, messages: list[dict[str, Any]]) -> ChatCompletionRequest:
    """The chat completions request a Responses request runs as (`messages` from chat_messages)."""
    fields = {"model": req.model, "messages": messages, "max_tokens": req.max_output_tokens,
              "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k, "seed": req.seed,
              "tools": function_tools(req.tools), "tool_choice": chat_tool_choice(req.tool_choice),
              "parallel_tool_calls": req.parallel_tool_calls, "response_format": text_format(req.text),
              "keep_alive": req.keep_alive, "chat_template_kwargs": req.chat_template_kwargs,
              "reasoning_effort": (req.reasoning or {}).get("effort")}
    try:
        return ChatCompletionRequest.model_validate({k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raise APIError(400, _("Invalid request: {problem} at {where}.").format(
            problem=first["msg"], where=".".join(map(str, first["loc"]))),
                       param="input") from None


def _usage(prompt_tokens: int, output_tokens: int, reasoning_tokens: int) -> dict[str, Any]:
    return {"input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": prompt_tokens + output_tokens}


async def create_response(request: Request) -> Response:
    req = parse_body(await request.body(), ResponsesRequest)
    history: list[dict[str, Any]] = []
    if req.previous_response_id:
        history = (await _owned(request, req.previous_response_id)).history
    items = normalised_input(req.input)
    chat = as_chat_request(req, chat_messages(history + items, req.instructions))

    async def respond(request: Request, state: ModelLease, chat: ChatCompletionRequest) -> Response:
        return await _respond(request, state, req, chat, history, items)

    return await with_lease(request, chat, respond)


async def _respond(request: Request, state: ModelLease, req: ResponsesRequest, chat: ChatCompletionRequest,
                   history: list[dict[str, Any]], items: list[dict[str, Any]]) -> Response:
    tools = tool_request(chat.tools, chat.tool_choice, chat.parallel_tool_calls)
    template = state.model.tokenizer.chat_template
    call_fmt = call_format(template) if tools and tools.parse_calls else None
    enforced_calls = tool_call_spec(tools, call_fmt)
    # A turn that must call a tool has no text answer for text.format to shape: the calls win (an
    # agent with an output type sends both until its tools have run).
    constraint = output_constraint(chat) if enforced_calls is None else None
    prompt_ids = await run_in_threadpool(chat_prompt, state, chat, tools)
    params = sampling_params(state, chat, len(prompt_ids), "input")
    thinking = thinking_of(state.model.tokenizer, prompt_ids)
    params.structured = after_reasoning(constraint or enforced_calls, thinking)  # the answer's, not the reasoning's
    await compile_constraint(state, params.structured)
    response_id = new_id("resp")
    created = time.time()
    parallel = tools.parallel if tools else True
    base = {
        "id": response_id, "object": "response", "created_at": created, "status": "in_progress", "model":
        state.model_name, "output": [], "instructions": req.instructions, "previous_response_id":
        req.previous_response_id, "tools": req.tools or [], "tool_choice": req.tool_choice or "auto",
        "parallel_tool_calls": parallel, "temperature": req.temperature, "top_p": req.top_p, "max_output_tokens":
        req.max_output_tokens, "text": req.text or {"format": {"type": "text"}}, "reasoning": req.reasoning,
        "store": req.store, "metadata": req.metadata or {}, "user": req.user, "truncation": "disabled",
        "incomplete_details": None, "error": None, "usage": None,
    }
    owner, store = request_owner(request), response_store(request)
    tokenizer = state.model.tokenizer

    def complete(output: list[dict[str, Any]], finish_reason: str | None, output_tokens: int,
                 error: str | None) -> dict[str, Any]:
        reasoning = "".join(c["text"] for i in output if i["type"] == "reasoning" for c in i["content"])
        final = {**base, "output": output, "completed_at": time.time(),
                 "usage": _usage(len(prompt_ids), output_tokens, len(tokenizer.encode(reasoning)) if reasoning else 0)}
        if error is not None:
            final.update(status="failed", error={"code": "server_error", "message": error})
        elif finish_reason == "length":
            final.update(status="incomplete", incomplete_details={"reason": "max_output_tokens"})
        else:
            final["status"] = "completed"
        if req.store and error is None:
            kept = store.put(StoredResponse(owner, final, items, history + items + output))
            final["store"] = kept
        return final

    handle = await submit(state, prompt_ids, params, response_id, "max_output_tokens")
    if req.stream:
        return GuardedStream(response_events(handle, base, call_fmt, ReplySplitter(tokenizer, thinking), parallel,
                                             complete),
                             on_close=handle.abort)
    try:
        result = await collect(request, handle)
    finally:
        handle.abort()
    if result.finish_reason == "error":
        raise APIError(500, result.error or _("the engine failed on this request"), code="engine_error")
    reasoning, answer, steps = split_reply(state.model.tokenizer, thinking, result.pieces)
    text, calls = parse_tool_calls(answer, call_fmt) if call_fmt else (answer, [])
    calls = calls if parallel else calls[:1]
    final = await run_in_threadpool(complete, output_items(reasoning, text, calls, steps), result.finish_reason,
                                    len(result.token_ids), None)
    return JSONResponse(final)


async def retrieve_response(request: Request, response_id: str) -> Response:
    return JSONResponse((await _owned(request, response_id)).response)


async def delete_response(request: Request, response_id: str) -> Response:
    store = await _check_owner(request, response_id)
    await run_in_threadpool(store.delete, response_id)
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})


async def list_input_items(request: Request, response_id: str) -> Response:
    stored = await _owned(request, response_id)
    query = request.query_params
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise APIError(400, _("order must be 'asc' or 'desc' (got {order}).").format(order=repr(order)), param="order")
    try:
        limit = int(query.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_INPUT_ITEMS_PAGE:
        raise APIError(400, _("limit must be an integer from 1 to {most}.").format(most=MAX_INPUT_ITEMS_PAGE),
                       param="limit")
    items = stored.input_items if order == "asc" else stored.input_items[::-1]
    after = query.get("after")
    if after:
        ids = [item.get("id") for item in items]
        if after not in ids:
            raise APIError(400, _("after names {id}, which is not an input item of this response.").format(
                id=repr(after)), param="after")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    return JSONResponse({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                         "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit})


ROUTES = [
    ("/v1/responses", create_response, "POST"), ("/v1/responses/{response_id}", retrieve_response, "GET"),
    ("/v1/responses/{response_id}", delete_response, "DELETE"),
    ("/v1/responses/{response_id}/input_items", list_input_items, "GET"),
]
