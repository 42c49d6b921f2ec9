"""POST /v1/messages: Anthropic's Messages API over the same engine, so Anthropic-client apps and agents
work unchanged. System prompt, content blocks (text, tool_use, tool_result), stop_sequences, tools and
tool_choice, streaming events (message_start ... message_stop); errors in Anthropic's shape."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from portachat.engine.async_engine import RequestStream
from portachat.engine.sampling_params import TEMPERATURE_MAX
from portachat.i18n import _
from portachat.serve.api.calculator_steps import ReplySplitter, split_reply, with_steps
from portachat.serve.api.errors import APIError
from portachat.serve.api.prompt import check_message_count
from portachat.serve.api.protocol import ChatCompletionRequest, parse_body
from portachat.serve.api.reasoning import Thinking, after_reasoning, template_variables, thinking_of
from portachat.serve.api.request_params import compile_constraint, sampling_params
from portachat.serve.api.sse import GuardedStream
from portachat.serve.api.state import ModelLease
from portachat.serve.api.submission import collect, submit, with_lease
from portachat.serve.api.tool_calls import (
    StreamingToolParser,
    ToolCall,
    ToolRequest,
    call_format,
    parse_tool_calls,
    tool_call_spec,
    tool_request,
)

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


class AnthropicTool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class MessagesRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    max_tokens: int = Field(json_schema_extra={"minimum": 1})  # ranges: sampling_params.from_request checks them
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(None, json_schema_extra={"minimum": 0.0, "maximum": TEMPERATURE_MAX})
    top_p: float | None = Field(None, json_schema_extra={"exclusiveMinimum": 0.0, "maximum": 1.0})
    top_k: int | None = Field(None, json_schema_extra={"minimum": 0})
    tools: list[AnthropicTool] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None  # {"type": "enabled" | "disabled"}: the template's enable_thinking
    keep_alive: str | float | None = None  # Ollama's: how long the model stays loaded afterwards


def anthropic_error(status: int, message: str) -> JSONResponse:
    kind = _ERROR_TYPES.get(status, "api_error")
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status_code=status)


def _text_of(content: Any, where: str) -> str:
    """A string, or text blocks joined; anything else in a text position is a 400."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(400, _("{where} must be a string or a list of content blocks.").format(where=where))
    parts = []
    for i, block in enumerate(content):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise APIError(400, _("{where}[{i}]: only text blocks are supported here (got {kind!r}).").format(
                                  where=where, i=i, kind=kind))
        parts.append(block["text"])
    return "".join(parts)


def template_messages(req: MessagesRequest) -> list[dict[str, Any]]:
    """Anthropic turns -> the messages chat templates read: tool_use blocks become the assistant's
    tool_calls, tool_result blocks become `tool` messages."""
    out: list[dict[str, Any]] = []
    if req.system:
        out.append({"role": "system", "content": _text_of(req.system, "system")})
    names: dict[str, str] = {}
    for i, message in enumerate(req.messages):
        role, content = message.get("role"), message.get("content")
        if role not in ("user", "assistant"):
            raise APIError(400, _("messages[{i}].role must be 'user' or 'assistant' (got {role!r}).").format(
                                  i=i, role=role))
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            raise APIError(400, _("messages[{i}].content must be a string or a list of content blocks.").format(
                                  i=i))
        text, calls, thoughts = [], [], []
        for j, block in enumerate(blocks):
            kind = block.get("type") if isinstance(block, dict) else None
            where = f"messages[{i}].content[{j}]"
            if kind == "text":
                text.append(str(block.get("text", "")))
            elif kind in ("thinking", "redacted_thinking") and role == "assistant":
                thoughts.append(str(block.get("thinking", "")))  # earlier reasoning: templates decide to keep it
            elif kind == "tool_use" and role == "assistant":
                names[str(block.get("id"))] = str(block.get("name"))
                calls.append({"id": block.get("id"), "type": "function",
                              "function": {"name": block.get("name"), "arguments": block.get("input") or {}}})
            elif kind == "tool_result" and role == "user":
                result = block.get("content", "")
                result_text = _text_of(result, where + ".content") if result else ""
                use_id = str(block.get("tool_use_id"))
                out.append({"role": "tool", "tool_call_id": use_id, "name": names.get(use_id, ""),
                            "content": result_text})
            else:
                raise APIError(400, _("{where}: block type {kind!r} is not supported in a {role} message "
                                      "(text, tool_use from the assistant, tool_result from the user).").format(
                                      where=where, kind=kind, role=role))
        if text or calls or not blocks:
            item: dict[str, Any] = {"role": role, "content": "".join(text)}
            if thoughts:
                item["reasoning_content"] = "".join(thoughts)
            if calls:
                item["tool_calls"] = calls
            out.append(item)
    if not req.messages:
        raise APIError(400, _("messages: at least one message is required."))
    return out


def _tools(req: MessagesRequest) -> ToolRequest | None:
    tools = [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                               "parameters": t.input_schema}} for t in req.tools or []]
    choice = req.tool_choice or {"type": "auto"}
    kind = choice.get("type")
    mapped: Any = {"auto": "auto", "any": "required", "none": "none"}.get(kind)
    if kind == "tool":
        mapped = {"type": "function", "function": {"name": choice.get("name")}}
    elif mapped is None:
        raise APIError(400, _("tool_choice.type must be auto, any, tool or none (got {kind!r}).").format(
                              kind=kind))
    return tool_request(tools or None, mapped if tools else None, not choice.get("disable_parallel_tool_use", False))


def _stop_reason(finish_reason: str | None, stop_string: str | None, calls: list[ToolCall]) -> str:
    if calls:
        return "tool_use"
    if finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if stop_string else "end_turn"


def _tool_block(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": "toolu_" + call.id.removeprefix("call_"), "name": call.name,
            "input": json.loads(call.arguments)}


async def messages(request: Request) -> Response:
    try:
        return await _messages(request)
    except APIError as exc:
        request.app.state.server.metrics.on_http_error(exc.status)
        return anthropic_error(exc.status, exc.message)


async def _messages(request: Request) -> Response:
    req = parse_body(await request.body(), MessagesRequest)
    check_message_count(len(req.messages), request.app.state.server.settings.max_messages)
    return await with_lease(request, req, _answer)


async def _answer(request: Request, state: ModelLease, req: MessagesRequest) -> Response:
    tools = _tools(req)
    chat_messages = template_messages(req)
    kind = (req.thinking or {}).get("type")
    variables = template_variables(None, enable_thinking={"enabled": True, "disabled": False}.get(kind))
    try:
        prompt_ids = await run_in_threadpool(lambda: state.model.tokenizer.render_prompt(
            chat_messages, tools.tools if tools else None, **({"template_kwargs": variables} if variables else {})))
    except Exception as exc:  # noqa: BLE001 - the template's or our format's refusal
        raise APIError(400, _("The conversation cannot be rendered with this model's chat template: {exc}").format(
                              exc=exc)) from None
    as_openai = ChatCompletionRequest.model_validate({
        "messages": [{"role": "user", "content": ""}], "max_tokens": req.max_tokens, "temperature": req.temperature,
        "top_p": req.top_p, "top_k": req.top_k, "stop": req.stop_sequences or None,
    })
    params = sampling_params(state, as_openai, len(prompt_ids), "messages")
    call_fmt = call_format(state.model.tokenizer.chat_template) if tools and tools.parse_calls else None
    thinking = thinking_of(state.model.tokenizer, prompt_ids)
    # tool_choice any / tool: the calls are enforced, after any reasoning
    params.structured = after_reasoning(tool_call_spec(tools, call_fmt), thinking)
    await compile_constraint(state, params.structured)
    message_id = f"msg_{uuid.uuid4().hex[:24]}"
    handle = await submit(state, prompt_ids, params, message_id, "max_tokens")
    if req.stream:
        stream = _stream(state, handle, message_id, len(prompt_ids), call_fmt, tools.parallel if tools else True,
                         thinking)
        return GuardedStream(stream, on_close=handle.abort)
    try:
        result = await collect(request, handle)
    finally:
        handle.abort()
    if result.finish_reason == "error":
        raise APIError(500, result.error or _("the engine failed on this request"))
    # Calculator steps and reasoning come out first: calls are parsed from the answer alone.
    reasoning, answer, steps = split_reply(state.model.tokenizer, thinking, result.pieces)
    reasoning = with_steps(reasoning, steps)
    text, calls = parse_tool_calls(answer, call_fmt) if call_fmt else (answer, [])
    calls = calls if not tools or tools.parallel else calls[:1]
    content = [{"type": "thinking", "thinking": reasoning, "signature": ""}] if reasoning is not None else []
    content += ([{"type": "text", "text": text}] if text else []) + [_tool_block(c) for c in calls]
    return JSONResponse({
        "id": message_id, "type": "message", "role": "assistant", "model": state.model_name,
        "content": content, "stop_reason": _stop_reason(result.finish_reason, result.stop_string, calls),
        "stop_sequence": result.stop_string, "usage": {"input_tokens": len(prompt_ids),
                                                       "output_tokens": len(result.token_ids)},
    })


def _event(name: str, payload: dict[str, Any]) -> bytes:
    data = json.dumps({"type": name, **payload}, ensure_ascii=False, separators=(",", ":"))
    return f"event: {name}\ndata: {data}\n\n".encode()


async def _stream(state: ModelLease, handle: RequestStream, message_id: str, prompt_len: int,
                  call_fmt: str | None, parallel: bool, thinking: Thinking) -> AsyncIterator[bytes]:
    yield _event("message_start", {"message": {
        "id": message_id, "type": "message", "role": "assistant", "model": state.model_name, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": prompt_len, "output_tokens": 0}}})
    yield _event("ping", {})
    parser, splitter = StreamingToolParser(call_fmt), ReplySplitter(state.model.tokenizer, thinking)
    index, text_open, thinking_open, output_tokens, calls_sent = 0, False, False, 0, 0
    async for output in handle:
        output_tokens += len(output.token_ids)
        piece = splitter.feed(output.text, output.token_ids, output.finished and output.finish_reason != "error")
        reasoning = piece.reasoning + "".join(("\n" if thinking_open or i or piece.reasoning else "") + s.readable()
                                              for i, s in enumerate(piece.steps))
        answer = piece.answer
        if reasoning:  # the thinking block comes first and closes before the answer's first block
            if not thinking_open:
                yield _event("content_block_start", {"index": index, "content_block": {
                    "type": "thinking", "thinking": "", "signature": ""}})
                thinking_open = True
            yield _event("content_block_delta", {"index": index, "delta": {"type": "thinking_delta",
                                                                            "thinking": reasoning}})
        text, found = parser.feed(answer)
        if output.finished and output.finish_reason != "error":
            rest, more = parser.finish()
            text, found = text + rest, found + more
        if thinking_open and (text or found or output.finished):
            yield _event("content_block_stop", {"index": index})
            index, thinking_open = index + 1, False
        if text:
            if not text_open:
                yield _event("content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}})
                text_open = True
            yield _event("content_block_delta", {"index": index, "delta": {"type": "text_delta", "text": text}})
        for call in found:
            if calls_sent and not parallel:
                break
            if text_open:
                yield _event("content_block_stop", {"index": index})
                index, text_open = index + 1, False
            block = _tool_block(call)
            yield _event("content_block_start", {"index": index, "content_block": {**block, "input": {}}})
            yield _event("content_block_delta", {"index": index, "delta": {"type": "input_json_delta",
                                                                            "partial_json": call.arguments}})
            yield _event("content_block_stop", {"index": index})
            index += 1
            calls_sent += 1
        if output.finished:
            if output.finish_reason == "error":
                yield _event("error", {"error": {"type": "api_error",
                                                 "message": output.error or _("the engine failed on this request")}})
                return
            if text_open:
                yield _event("content_block_stop", {"index": index})
            reason = "tool_use" if calls_sent else _stop_reason(output.finish_reason, output.stop_string, [])
            yield _event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": output.stop_string},
                                           "usage": {"output_tokens": output_tokens}})
            yield _event("message_stop", {})
            return
