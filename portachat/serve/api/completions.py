"""POST /v1/chat/completions and /v1/completions: request -> prompt ids (prompt.py) -> sampling
params and constraint (request_params.py) -> engine (submission.py) -> OpenAI JSON or SSE (streaming.py)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from portachat.i18n import _
from portachat.serve.api.calculator_steps import split_reply, with_steps
from portachat.serve.api.errors import APIError
from portachat.serve.api.grounding import ground_chat
from portachat.serve.api.prompt import chat_prompt, completion_prompt
from portachat.serve.api.protocol import ChatCompletionRequest, CompletionRequest, check_supported, parse_body
from portachat.serve.api.reasoning import Thinking, after_reasoning, thinking_of
from portachat.serve.api.reply_shapes import chat_logprobs, completion_logprobs, prompt_logprobs, usage
from portachat.serve.api.request_params import compile_constraint, output_constraint, sampling_params
from portachat.serve.api.sse import GuardedStream
from portachat.serve.api.state import ModelLease
from portachat.serve.api.streaming import chat_stream, completion_stream
from portachat.serve.api.submission import (
    Collected,
    abort_all,
    finished_results,
    score_prompt,
    submit_n,
    with_lease,
)
from portachat.serve.api.tool_calls import (
    ToolRequest,
    call_format,
    parse_tool_calls,
    tool_call_spec,
    tool_request,
)


async def chat_completions(request: Request) -> Response:
    req = parse_body(await request.body(), ChatCompletionRequest)
    check_supported(req)
    return await with_lease(request, req, _chat_completions)


async def _chat_completions(request: Request, state: ModelLease, req: ChatCompletionRequest) -> Response:
    citations = await ground_chat(request, req, state)  # vendor field `documents`: passages into the messages
    tools = tool_request(req.tools, req.tool_choice, req.parallel_tool_calls)
    call_fmt = call_format(state.model.tokenizer.chat_template) if tools and tools.parse_calls else None
    constraint = output_constraint(req)
    enforced_calls = tool_call_spec(tools, call_fmt)
    if constraint is not None and enforced_calls is not None:
        raise APIError(400, _("tool_choice {tool_choice!r} and {other} both constrain the reply: send one "
                              "of them.").format(tool_choice=req.tool_choice,
                                                 other=constraint.param.split('.')[0]), param="tool_choice")
    prompt_ids = await run_in_threadpool(chat_prompt, state, req, tools)
    max_param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    params = sampling_params(state, req, len(prompt_ids), "messages")
    thinking = thinking_of(state.model.tokenizer, prompt_ids)
    params.structured = after_reasoning(constraint or enforced_calls, thinking)  # the answer's, not the reasoning's
    await compile_constraint(state, params.structured)
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    handles = await submit_n(state, prompt_ids, params, request_id, max_param, req.n)
    if req.stream:
        options = req.stream_options
        return GuardedStream(
            chat_stream(state, handles, request_id, created, len(prompt_ids), req.logprobs,
                        bool(options and options.include_usage), bool(options and options.continuous_usage_stats),
                        call_fmt, tools.parallel if tools else True, thinking, citations),
            on_close=abort_all(handles),
        )
    results = await finished_results(request, handles)
    choices = [_chat_choice(state, i, result, req.logprobs, call_fmt, tools, thinking)
               for i, result in enumerate(results)]
    return JSONResponse({
        "id": request_id, "object": "chat.completion", "created": created, "model": state.model_name,
        "choices": choices, "usage": usage(len(prompt_ids), sum(len(r.token_ids) for r in results)),
        **({"citations": citations} if citations is not None else {}),
    })


def _chat_choice(state: ModelLease, index: int, result: Collected, logprobs: bool, call_fmt: str | None,
                 tools: ToolRequest | None, thinking: Thinking) -> dict[str, Any]:
    # Calculator steps and reasoning come out first: calls are parsed from the answer alone.
    reasoning, answer, steps = split_reply(state.model.tokenizer, thinking, result.pieces)
    reasoning = with_steps(reasoning, steps)
    message: dict[str, Any] = {"role": "assistant", "content": answer}
    finish_reason = result.finish_reason
    if call_fmt is not None:
        content, calls = parse_tool_calls(answer, call_fmt)
        if calls:
            calls = calls if tools.parallel else calls[:1]
            message = {"role": "assistant", "content": content or None,
                       "tool_calls": [c.openai() for c in calls]}
            finish_reason = "tool_calls"
    if reasoning is not None:  # vLLM's older and newer names, both
        message.update(reasoning_content=reasoning, reasoning=reasoning)
    return {
        "index": index,
        "message": message,
        "logprobs": chat_logprobs(state, result.token_ids, result.logprobs, result.top_logprobs) if logprobs else None,
        "finish_reason": finish_reason,
    }

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
    scored = None  # vLLM's prompt_logprobs: before the reply's tokens, so a full cache fails before any run
    if req.prompt_logprobs is not None:
        scores = await score_prompt(state, prompt_ids, req.prompt_logprobs)
        scored = await run_in_threadpool(prompt_logprobs, state, prompt_ids, scores)
    handles = await submit_n(state, prompt_ids, params, request_id, "max_tokens", req.n)
    want_logprobs = req.logprobs is not None
    want_tops = bool(req.logprobs)
    if req.stream:
        options = req.stream_options
        return GuardedStream(
            completion_stream(state, handles, request_id, created, len(prompt_ids), echo, want_logprobs, want_tops,
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
        **({"prompt_logprobs": scored} if scored is not None else {}),
    } for i, result in enumerate(results)]
    return JSONResponse({
        "id": request_id, "object": "text_completion", "created": created, "model": state.model_name,
        "choices": choices, "usage": usage(len(prompt_ids), sum(len(r.token_ids) for r in results)),
    })
