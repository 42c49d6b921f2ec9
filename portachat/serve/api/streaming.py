"""The SSE streams of chat completions and completions: chunks in OpenAI's format, n choices
interleaved as their tokens arrive, usage when asked for, [DONE] last."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from portachat.engine.async_engine import RequestStream
from portachat.engine.types import RequestOutput
from portachat.i18n import _
from portachat.serve.api.calculator_steps import ReplySplitter
from portachat.serve.api.errors import error_body
from portachat.serve.api.reasoning import NO_THINKING, Thinking
from portachat.serve.api.reply_shapes import chat_logprobs, completion_logprobs, logprobs_of, tops_of, usage
from portachat.serve.api.sse import SSE_DONE, sse_event
from portachat.serve.api.state import ModelLease
from portachat.serve.api.tool_calls import StreamingToolParser


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


def engine_error_event(output: RequestOutput) -> bytes:
    """The SSE error event of a request the engine failed (OpenAI's error shape, 500)."""
    message = output.error or _("the engine failed on this request")
    return sse_event(error_body(500, message, code="engine_error"))


async def stream_choices(choices: list[AsyncIterator[tuple[bytes, bool]]],
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

async def chat_stream(state: ModelLease, handles: list[RequestStream], request_id: str, created: int,
                       prompt_len: int, logprobs: bool, include_usage: bool, continuous_usage: bool,
                       call_fmt: str | None = None, parallel_calls: bool = True,
                       thinking: Thinking = NO_THINKING, citations: list[dict] | None = None) -> AsyncIterator[bytes]:
    """`citations` (a grounded request's, grounding.py) ride on the first chunk built."""
    base = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": state.model_name}
    completion_tokens = 0  # over every choice; the prompt counts once
    cited = citations is None

    def chunk(index: int, delta: dict, finish_reason: str | None = None, lp: dict | None = None) -> bytes:
        nonlocal cited
        payload = {**base, "choices": [{"index": index, "delta": delta, "logprobs": lp,
                                        "finish_reason": finish_reason}]}
        if not cited:
            payload["citations"], cited = citations, True
        if include_usage:  # OpenAI: null on every chunk but the last
            payload["usage"] = usage(prompt_len, completion_tokens) if continuous_usage else None
        return sse_event(payload)

    async def choice(index: int, handle: RequestStream) -> AsyncIterator[tuple[bytes, bool]]:
        """One choice's events, each with whether it is an error (which ends the whole stream)."""
        nonlocal completion_tokens
        calls = StreamingToolParser(call_fmt) if call_fmt is not None else None
        splitter = ReplySplitter(state.model.tokenizer, thinking)
        reasoning_sent = False
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
            # Reasoning and calculator steps first: calls and content come from the answer after them.
            piece = splitter.feed(output.text, output.token_ids, output.finished and output.finish_reason != "error")
            reasoning = piece.reasoning + "".join(
                ("\n" if reasoning_sent or i or piece.reasoning else "") + step.readable()
                for i, step in enumerate(piece.steps))
            answer = piece.answer
            if reasoning:
                reasoning_sent = True
                yield chunk(index, {"reasoning_content": reasoning, "reasoning": reasoning}), False
            text, found = calls.feed(answer) if calls is not None else (answer, [])
            if output.finished and calls is not None and output.finish_reason != "error":
                rest, more = calls.finish()
                text, found = text + rest, found + more
            if text or (logprobs and output.token_ids):  # held-back bytes: nothing to show yet
                lp = chat_logprobs(state, output.token_ids, logprobs_of(output), tops_of(output)) \
                    if logprobs else None
                yield chunk(index, {"content": text}, lp=lp), False
            for piece in call_chunks(found):
                yield piece, False
            if output.finished:
                if output.finish_reason == "error":
                    yield engine_error_event(output), True
                    return
                yield chunk(index, {}, "tool_calls" if sent_calls else output.finish_reason), False

    def final_usage() -> dict:  # read after every choice has finished
        return {**base, "choices": [], "usage": usage(prompt_len, completion_tokens)}

    async for event in stream_choices([choice(i, h) for i, h in enumerate(handles)],
                                       final_usage if include_usage else None):
        yield event


async def completion_stream(state: ModelLease, handles: list[RequestStream], request_id: str, created: int,
                             prompt_len: int, echo: str, logprobs: bool, tops: bool, include_usage: bool,
                             continuous_usage: bool) -> AsyncIterator[bytes]:
    base = {"id": request_id, "object": "text_completion", "created": created, "model": state.model_name}
    completion_tokens = 0  # over every choice; the prompt counts once

    def chunk(index: int, text: str, finish_reason: str | None = None, lp: dict | None = None) -> bytes:
        payload = {**base, "choices": [{"index": index, "text": text, "logprobs": lp,
                                        "finish_reason": finish_reason}]}
        if include_usage:
            payload["usage"] = usage(prompt_len, completion_tokens) if continuous_usage else None
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
                lp = completion_logprobs(state, output.token_ids, logprobs_of(output), offset,
                                         tops_of(output) if tops else None) if logprobs else None
                offset += len(output.text)
                yield chunk(index, output.text, lp=lp), False
            if output.finished:
                if output.finish_reason == "error":
                    yield engine_error_event(output), True
                    return
                yield chunk(index, "", output.finish_reason), False

    def final_usage() -> dict:  # read after every choice has finished
        return {**base, "choices": [], "usage": usage(prompt_len, completion_tokens)}

    async for event in stream_choices([choice(i, h) for i, h in enumerate(handles)],
                                       final_usage if include_usage else None):
        yield event
