"""Tool calls: OpenAI's `tools` / `tool_choice` checked, and the calls a model writes parsed back out.

Each model family writes calls its own way, as its chat template teaches it:
- Hermes style (Qwen2.5, Qwen3, many fine-tunes): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
  one block per call, text before them is ordinary content.
- Llama 3.x JSON: the whole reply is `{"name": ..., "parameters": {...}}` (optionally after
  `<|python_tag|>`), several calls separated by `;`.
The parser is picked from the template's text. Parsing is separate from enforcing: `required` and
named choices are constrained by the structured-output machinery, so their arguments always parse.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from portachat.engine.structured import StructuredSpec
from portachat.engine.structured.compile import json_options
from portachat.i18n import _
from portachat.serve.api.errors import APIError

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = ""

    def __post_init__(self) -> None:
        self.id = self.id or f"call_{uuid.uuid4().hex[:24]}"

    def openai(self, index: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "type": "function",
                               "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            out = {"index": index, **out}
        return out


# ------------------------------------------------------------------------------------------ request side


@dataclass
class ToolRequest:
    """What a request's `tools` / `tool_choice` / `parallel_tool_calls` ask for, validated."""

    tools: list[dict[str, Any]]  # OpenAI function definitions, passed to the chat template as they are
    choice: str  # "auto" | "none" | "required" | "named"
    named: str | None = None  # the function's name for a named choice
    parallel: bool = True

    @property
    def parse_calls(self) -> bool:
        return bool(self.tools) and self.choice != "none"

    def function(self, name: str) -> dict[str, Any]:
        return next(t["function"] for t in self.tools if t["function"]["name"] == name)


def tool_request(tools: list[Any] | None, tool_choice: Any, parallel_tool_calls: bool | None) -> ToolRequest | None:
    """Validate the tool fields (400 naming the field on anything malformed); None without tools."""
    if not tools:
        if tool_choice not in (None, "none", "auto"):
            raise APIError(400, _("tool_choice needs a non-empty 'tools' list."), param="tool_choice")
        return None
    names = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            raise APIError(400, _("tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": "
                                  "..., \"parameters\": {{...}}}}}}.").format(i=i), param=f"tools[{i}]")
        name = fn.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", name):
            raise APIError(400, _("tools[{i}].function.name must be 1-64 letters, digits, '_', '.' or '-' "
                                  "(got {name!r}).").format(i=i, name=name),
                           param=f"tools[{i}].function.name")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise APIError(400, _("tools[{i}].function.parameters must be a JSON Schema object.").format(i=i),
                           param=f"tools[{i}].function.parameters")
        if name in names:
            raise APIError(400, _("Two tools are named {name!r}: tool names must be unique.").format(
                                  name=name), param="tools")
        names.append(name)
    request = ToolRequest(tools=[_normalised(t) for t in tools], choice="auto", parallel=parallel_tool_calls is not False)
    if tool_choice is None or tool_choice in ("auto", "none", "required"):
        request.choice = tool_choice or "auto"
        return request
    fn = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    if not isinstance(fn, dict) or tool_choice.get("type") != "function" or not isinstance(fn.get("name"), str):
        raise APIError(400, _("tool_choice must be 'auto', 'none', 'required' or {{\"type\": \"function\", "
                              "\"function\": {{\"name\": ...}}}}."), param="tool_choice")
    if fn["name"] not in names:
        raise APIError(400, _("tool_choice names {name!r}, which is not among the tools ({names}).").format(
                              name=fn['name'], names=', '.join(names)), param="tool_choice")
    request.choice, request.named = "named", fn["name"]
    return request


def _normalised(tool: dict[str, Any]) -> dict[str, Any]:
    fn = dict(tool["function"])
    fn.setdefault("parameters", {"type": "object", "properties": {}})
    return {"type": "function", "function": fn}


def tool_call_spec(tools: ToolRequest | None, fmt: str | None) -> StructuredSpec | None:
    """The grammar that enforces `tool_choice` "required" (one of the tools; one or more calls when
    parallel calls are allowed) or a named function (exactly one call of it), in the call format the
    model's template teaches, each call's arguments held to that function's parameter schema.
    None for "auto" / "none", which leave the model free."""
    if tools is None or tools.choice not in ("required", "named"):
        return None
    if fmt is None:
        raise APIError(400, _("tool_choice {choice!r} cannot be enforced: this model's chat template "
                              "teaches no tool-call format (Hermes <tool_call> blocks or Llama 3 JSON "
                              "calls). Use tool_choice 'auto', or serve the model with `--chat-template` "
                              "naming one that has tools.").format(choice=tools.choice),
                       param="tool_choice")
    functions = [tools.function(tools.named)] if tools.choice == "named" else [t["function"] for t in tools.tools]
    args_key = "arguments" if fmt == "hermes" else "parameters"
    rules = []
    for i, fn in enumerate(functions):
        params = dict(fn["parameters"])
        # "#/$defs/..." references resolve against the document root, which the call object now is.
        defs = {k: params.pop(k) for k in ("$defs", "definitions") if k in params}
        schema = {"type": "object", "properties": {"name": {"const": fn["name"]}, args_key: params},
                  "required": ["name", args_key], "additionalProperties": False, "x-guidance": json_options(), **defs}
        rules.append(f"fn{i}: %json{json.dumps(schema)}")
    one = " | ".join(f"fn{i}" for i in range(len(functions)))
    many = tools.choice == "required" and tools.parallel
    if fmt == "hermes":
        call = f"call: {json.dumps(HERMES_OPEN + chr(10))} ({one}) {json.dumps(chr(10) + HERMES_CLOSE)}"
        start = f"start: call ({json.dumps(chr(10))} call)*" if many else "start: call"
    else:
        call = f"call: {one}"
        start = 'start: call ("; " call)*' if many else "start: call"
    return StructuredSpec("grammar", "\n".join([start, call, *rules]), param="tool_choice")


def _calculator_parts(message: Any) -> list[dict[str, str]] | None:
    """A message's content as parts when a calculator step is among them (they render as its tool
    tokens), else None (the content is then one string)."""
    content = getattr(message, "content", None)
    if isinstance(content, list) and any(part.type != "text" for part in content):
        return [{"type": part.type, "text": part.text} for part in content]
    return None


def template_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """OpenAI messages -> the dicts chat templates read (transformers' convention): assistant
    `tool_calls` with `arguments` as a dict, `tool` results with their `tool_call_id` and name, content
    as one string unless it holds a calculator step (then our chat format's parts)."""
    names: dict[str, str] = {}
    out = []
    for m in messages:
        role = "system" if m.role == "developer" else m.role
        item: dict[str, Any] = {"role": role, "content": _calculator_parts(m) or m.text()}
        reasoning = next((r for r in (getattr(m, "reasoning_content", None), getattr(m, "reasoning", None))
                          if r is not None), None)
        if reasoning is not None:  # an assistant's earlier reasoning: templates read reasoning_content
            item["reasoning_content"] = reasoning
        if m.tool_calls:
            calls = []
            for call in m.tool_calls:
                fn = call.get("function", {}) if isinstance(call, dict) else {}
                arguments = fn.get("arguments", "{}")
                if isinstance(arguments, str):
                    try:
                        arguments = json.loads(arguments or "{}")
                    except json.JSONDecodeError:
                        raise APIError(400, _("The arguments of tool call {call_id!r} are not valid JSON.").format(
                                              call_id=call.get('id')),
                                       param="messages") from None
                names[call.get("id", "")] = fn.get("name", "")
                calls.append({"id": call.get("id"), "type": "function",
                              "function": {"name": fn.get("name"), "arguments": arguments}})
            item["tool_calls"] = calls
        if role == "tool":
            item["tool_call_id"] = m.tool_call_id
            item["name"] = m.name or names.get(m.tool_call_id or "", "")
        elif m.name:
            item["name"] = m.name
        out.append(item)
    return out


# ------------------------------------------------------------------------------------------ model side


def call_format(chat_template: str | None) -> str | None:
    """The tool-call format a chat template teaches: 'hermes', 'llama3_json', or None."""
    if not chat_template:
        return None
    if HERMES_OPEN in chat_template:
        return "hermes"
    if PYTHON_TAG in chat_template or '"parameters"' in chat_template or "parameters" in chat_template:
        return "llama3_json"
    return None


def _call_from(obj: Any) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


def parse_tool_calls(text: str, fmt: str | None) -> tuple[str, list[ToolCall]]:
    """(content, calls) of a finished reply. Text that does not parse as a call stays content."""
    if fmt == "hermes":
        calls, content, at = [], [], 0
        for m in re.finditer(re.escape(HERMES_OPEN) + r"(.*?)(?:" + re.escape(HERMES_CLOSE) + r"|$)", text, re.S):
            try:
                call = _call_from(json.loads(m.group(1).strip()))
            except json.JSONDecodeError:
                call = None
            if call is None:
                continue
            content.append(text[at : m.start()])
            at = m.end()
            calls.append(call)
        content.append(text[at:])
        return "".join(content).strip() if calls else text, calls
    if fmt == "llama3_json":
        body = text.strip().removeprefix(PYTHON_TAG).strip()
        if not body.startswith("{"):
            return text, []
        calls = []
        decoder = json.JSONDecoder()
        at = 0
        while at < len(body):
            try:
                obj, end = decoder.raw_decode(body, at)
            except json.JSONDecodeError:
                return text, []
            call = _call_from(obj)
            if call is None:
                return text, []
            calls.append(call)
            at = end
            while at < len(body) and body[at] in " \n\t;":
                at += 1
        return "", calls
    return text, []


class StreamingToolParser:
    """Splits a streamed reply into content deltas and finished calls.

    Content is passed on as it comes until something that may open a call appears; from there the
    text is held until the call closes (or the reply ends), then the call is emitted whole, as
    OpenAI's `delta.tool_calls` (id, name, then the arguments)."""

    def __init__(self, fmt: str | None) -> None:
        self.fmt = fmt
        self.text = ""  # everything so far
        self.sent = 0  # characters of `text` passed on as content
        self.calls: list[ToolCall] = []

    def feed(self, delta: str) -> tuple[str, list[ToolCall]]:
        self.text += delta
        if self.fmt == "llama3_json":
            if self.text.lstrip()[:1] in ("{", "<") or not self.text.strip():
                return "", []  # maybe a JSON call: wait for the end
            return self._pass_on(len(self.text)), []
        if self.fmt != "hermes":
            return self._pass_on(len(self.text)), []
        new_calls: list[ToolCall] = []
        while True:
            start = self.text.find(HERMES_OPEN, self.sent)
            if start < 0:
                # Keep back a tail that could be the start of "<tool_call>".
                keep = next((k for k in range(len(HERMES_OPEN) - 1, 0, -1) if self.text.endswith(HERMES_OPEN[:k])), 0)
                return self._pass_on(len(self.text) - keep), new_calls
            content = self._pass_on(start)
            end = self.text.find(HERMES_CLOSE, start)
            if end < 0:
                return content, new_calls
            _, calls = parse_tool_calls(self.text[start : end + len(HERMES_CLOSE)], "hermes")
            self.sent = end + len(HERMES_CLOSE)
            self.calls += calls
            new_calls += calls
            if content:  # content before a call goes out before it
                return content, new_calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        """Whatever is still held when the reply ends."""
        rest = self.text[self.sent :]
        self.sent = len(self.text)
        content, calls = parse_tool_calls(rest, self.fmt)
        self.calls += calls
        return content if calls else rest, calls

    def _pass_on(self, upto: int) -> str:
        out = self.text[self.sent : upto]
        self.sent = max(self.sent, upto)
        return out
