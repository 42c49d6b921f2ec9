"""The SSE stream of POST /v1/responses with `stream: true`, in the event types OpenAI's SDKs read:
response.created, response.in_progress, then per output item output_item.added, its deltas
(reasoning_text.delta, output_text.delta inside a content part, function_call_arguments.delta), its
.done events and output_item.done, and last response.completed (or response.incomplete when
max_output_tokens cut the reply, response.failed when the engine failed). Every event carries a
sequence_number."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from portachat.engine.async_engine import RequestStream
from portachat.i18n import _
from portachat.serve.api.calculator_steps import CalculatorStep, ReplySplitter
from portachat.serve.api.response_items import (
    calculator_item,
    call_item,
    message_item,
    new_id,
    reasoning_item,
)
from portachat.serve.api.tool_calls import StreamingToolParser, ToolCall

# (output items, finish reason, output tokens, error) -> the final response object
Complete = Callable[[list[dict[str, Any]], str | None, int, str | None], dict[str, Any]]


@dataclass
class _Open:
    """The output item now being streamed: a reasoning item or a message."""

    kind: str
    index: int
    item_id: str
    text: str = ""


@dataclass
class _Events:
    sequence: int = 0
    items: list[dict[str, Any]] = field(default_factory=list)
    open: _Open | None = None

    def event(self, kind: str, **payload: Any) -> bytes:
        data = json.dumps({"type": kind, "sequence_number": self.sequence, **payload}, ensure_ascii=False,
                          separators=(",", ":"))
        self.sequence += 1
        return f"event: {kind}\ndata: {data}\n\n".encode()

    def begin(self, kind: str) -> list[bytes]:
        """Close whatever is open and open a `kind` item ("reasoning" or "message")."""
        out = self.close()
        index = len(self.items)
        self.open = _Open(kind, index, new_id("rs" if kind == "reasoning" else "msg"))
        if kind == "reasoning":
            item = {**reasoning_item("", self.open.item_id), "content": [], "status": "in_progress"}
            self.items.append(item)
            return out + [self.event("response.output_item.added", output_index=index, item=item)]
        item = {**message_item("", self.open.item_id, "in_progress"), "content": []}
        self.items.append(item)
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return out + [self.event("response.output_item.added", output_index=index, item=item),
                      self.event("response.content_part.added", item_id=self.open.item_id, output_index=index,
                                 content_index=0, part=part)]

    def delta(self, kind: str, text: str) -> list[bytes]:
        out = self.begin(kind) if self.open is None or self.open.kind != kind else []
        self.open.text += text
        name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra = {} if kind == "reasoning" else {"logprobs": []}
        return out + [self.event(name, item_id=self.open.item_id, output_index=self.open.index, content_index=0,
                                 delta=text, **extra)]

    def close(self) -> list[bytes]:
        if self.open is None:
            return []
        o, self.open = self.open, None
        if o.kind == "reasoning":
            item = self.items[o.index] = reasoning_item(o.text, o.item_id)
            return [self.event("response.reasoning_text.done", item_id=o.item_id, output_index=o.index,
                               content_index=0, text=o.text),
                    self.event("response.output_item.done", output_index=o.index, item=item)]
        item = self.items[o.index] = message_item(o.text, o.item_id)
        return [self.event("response.output_text.done", item_id=o.item_id, output_index=o.index, content_index=0,
                           text=o.text, logprobs=[]),
                self.event("response.content_part.done", item_id=o.item_id, output_index=o.index, content_index=0,
                           part=item["content"][0]),
                self.event("response.output_item.done", output_index=o.index, item=item)]

    def calculation(self, step: CalculatorStep) -> list[bytes]:
        """A built-in calculator step: a code_interpreter_call item, added and done at once."""
        out = self.close()
        index = len(self.items)
        item = calculator_item(step)
        self.items.append(item)
        return out + [self.event("response.output_item.added", output_index=index,
                                 item={**item, "status": "in_progress", "outputs": []}),
                      self.event("response.output_item.done", output_index=index, item=item)]

    def call(self, call: ToolCall) -> list[bytes]:
        out = self.close()
        index = len(self.items)
        item = call_item(call)
        self.items.append(item)
        return out + [
            self.event("response.output_item.added", output_index=index,
                       item={**item, "arguments": "", "status": "in_progress"}),
            self.event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                       delta=call.arguments),
            self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                       name=call.name, arguments=call.arguments),
            self.event("response.output_item.done", output_index=index, item=item)]


async def response_events(handle: RequestStream, in_progress: dict[str, Any], call_fmt: str | None,
                          splitter: ReplySplitter, parallel: bool, complete: Complete) -> AsyncIterator[bytes]:
    events = _Events()
    yield events.event("response.created", response=in_progress)
    yield events.event("response.in_progress", response=in_progress)
    calls = StreamingToolParser(call_fmt)
    output_tokens, sent_calls = 0, 0
    async for output in handle:
        output_tokens += len(output.token_ids)
        ending = output.finished and output.finish_reason != "error"
        piece = splitter.feed(output.text, output.token_ids, ending)
        reasoning, answer = piece.reasoning, piece.answer
        if reasoning:
            for event in events.delta("reasoning", reasoning):
                yield event
        for step in piece.steps:
            for event in events.calculation(step):
                yield event
        text, found = calls.feed(answer)
        if ending:
            rest, more = calls.finish()
            text, found = text + rest, found + more
        if text:
            for event in events.delta("message", text):
                yield event
        for call in found:
            if sent_calls and not parallel:
                break
            sent_calls += 1
            for event in events.call(call):
                yield event
        if output.finished:
            error = (output.error or _("the engine failed on this request")) if output.finish_reason == "error" else None
            if not events.items and error is None:
                for event in events.begin("message"):  # an empty reply is still one (empty) message
                    yield event
            for event in events.close():
                yield event
            final = complete(events.items, output.finish_reason, output_tokens, error)
            kind = {"completed": "response.completed", "incomplete": "response.incomplete"}.get(final["status"],
                                                                                              "response.failed")
            yield events.event(kind, response=final)
            return
