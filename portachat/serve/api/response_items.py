"""Responses API items <-> the chat messages our templates render, and the reply's output items.

Input items: a string (one user message), or a list of `message` items (role + text or content
parts), `function_call` items (the model's earlier calls), `function_call_output` items (their
results), `code_interpreter_call` items (the built-in calculator's earlier steps, as this server
output them) and `reasoning` items (earlier reasoning: kept in the history, not sent back to the model).
Output items: `reasoning` (when the model's template thinks), one `code_interpreter_call` per calculator
step, `message` with `output_text`, and one `function_call` per call the model made.

A calculator step goes back to the model as our chat format's own parts of the assistant's turn
(`python` then `python_output`, tokenizer/chat.py), so the next prompt holds the step's tool tokens as
the model wrote them. Steps come before the turn's text, in the order the output items list them."""

from __future__ import annotations

import uuid
from typing import Any

from portachat.i18n import _
from portachat.serve.api.calculator_steps import CalculatorStep
from portachat.serve.api.errors import APIError
from portachat.serve.api.tool_calls import ToolCall

_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def normalised_input(value: str | list[Any]) -> list[dict[str, Any]]:
    """The request's `input` as a list of items, each with an id (what input_items lists)."""
    items = [{"type": "message", "role": "user", "content": value}] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise APIError(400, _("'input' must be a non-empty string or a non-empty list of items."), param="input")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise APIError(400, _("input[{i}] must be an object (a message, function_call or function_call_output "
                                  "item).").format(i=i), param=f"input[{i}]")
        kind = item.get("type") or ("message" if "role" in item else None)
        item = {**item, "type": kind}
        if kind == "message":
            if item.get("role") not in ("user", "assistant", "system", "developer"):
                raise APIError(400, _("input[{i}].role must be user, assistant, system or developer (got {role}).").format(
                    i=i, role=repr(item.get("role"))), param=f"input[{i}].role")
            item["content"] = _content_parts(item.get("content"), item["role"], f"input[{i}].content")
            item.setdefault("id", new_id("msg"))
            item.setdefault("status", "completed")
        elif kind == "function_call":
            for key in ("call_id", "name", "arguments"):
                if not isinstance(item.get(key), str):
                    raise APIError(400, _("{where} must be a string.").format(where=f"input[{i}].{key}"),
                                   param=f"input[{i}].{key}")
            item.setdefault("id", new_id("fc"))
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise APIError(400, _("{where} must be a string.").format(where=f"input[{i}].call_id"),
                               param=f"input[{i}].call_id")
            item["output"] = _output_text(item.get("output"), f"input[{i}].output")
            item.setdefault("id", new_id("fco"))
        elif kind == "code_interpreter_call":
            if not isinstance(item.get("code"), str):
                raise APIError(400, _("{where} must be a string.").format(where=f"input[{i}].code"),
                               param=f"input[{i}].code")
            _calculator_logs(item.get("outputs"), f"input[{i}].outputs")
            item.setdefault("id", new_id("ci"))
        elif kind == "reasoning":
            item.setdefault("id", new_id("rs"))
        else:
            raise APIError(400, _("input[{i}]: item type {kind} is not supported (message, function_call, "
                                  "function_call_output, code_interpreter_call, reasoning).").format(
                i=i, kind=repr(kind)), param=f"input[{i}].type")
        out.append(item)
    return out


def _content_parts(content: Any, role: str, where: str) -> list[dict[str, Any]]:
    kind = "output_text" if role == "assistant" else "input_text"
    if isinstance(content, str):
        return [{"type": kind, "text": content}]
    if not isinstance(content, list):
        raise APIError(400, _("{where} must be a string or a list of text parts.").format(where=where), param=where)
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            got = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise APIError(400, _("{where}: only text parts are supported (input_text, output_text; got {kind}).").format(
                where=f"{where}[{j}]", kind=repr(got)), param=f"{where}[{j}]")
    return content


def _output_text(output: Any, where: str) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return "".join(str(p.get("text", "")) for p in output if isinstance(p, dict))
    raise APIError(400, _("{where} must be a string.").format(where=where), param=where)


def _calculator_logs(outputs: Any, where: str) -> str | None:
    """A code_interpreter_call's `outputs` -> the calculator's result (None: it gave none)."""
    if outputs is None:
        return None
    if not isinstance(outputs, list):
        raise APIError(400, _("{where} must be a list of logs outputs or null.").format(where=where), param=where)
    for j, output in enumerate(outputs):
        if not isinstance(output, dict) or output.get("type") != "logs" or not isinstance(output.get("logs"), str):
            raise APIError(400, _("{where}: each output of a calculator step must be a logs output, "
                                  "{{'type': 'logs', 'logs': TEXT}} (the calculator writes no images or files).").format(
                where=f"{where}[{j}]"), param=f"{where}[{j}]")
    return "".join(output["logs"] for output in outputs) if outputs else None


def _text(parts: list[dict[str, Any]]) -> str:
    return "".join(p.get("text", "") for p in parts)


def _parts(content: str | list[dict[str, str]]) -> list[dict[str, str]]:
    """An assistant message's content as our chat format's parts (a calculator step joins them)."""
    if isinstance(content, list):
        return content
    return [{"type": "text", "text": content}] if content else []


def chat_messages(items: list[dict[str, Any]], instructions: str | None) -> list[dict[str, Any]]:
    """Items -> OpenAI chat messages (dicts ChatCompletionRequest reads): an assistant's function calls
    join its message, each output becomes a `tool` message, a calculator step becomes `python` and
    `python_output` parts of the assistant's turn (the answer after it joins the same turn)."""
    out: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    reasoning = None  # a reasoning item goes with the assistant turn after it (templates decide to show it)
    for item in items:
        kind = item["type"]
        if kind == "reasoning":
            reasoning = "".join(p.get("text", "") for p in item.get("content") or [] if isinstance(p, dict))
        elif kind == "message":
            last = out[-1] if out else None
            if item["role"] == "assistant" and last is not None and last["role"] == "assistant" \
                    and isinstance(last["content"], list):  # the answer after a calculator step: the same turn
                last["content"].append({"type": "text", "text": _text(item["content"])})
            else:
                out.append({"role": item["role"], "content": _text(item["content"])})
        elif kind == "code_interpreter_call":
            step = [{"type": "python", "text": item["code"]}]
            result = _calculator_logs(item.get("outputs"), "outputs")
            if result is not None:
                step.append({"type": "python_output", "text": result})
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last["content"] = _parts(last["content"]) + step
            else:
                out.append({"role": "assistant", "content": step})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
        if kind != "reasoning" and reasoning is not None:
            if out and out[-1]["role"] == "assistant":
                out[-1]["reasoning_content"] = reasoning
            reasoning = None
    return out


def function_tools(tools: list[Any] | None) -> list[dict[str, Any]] | None:
    """Responses' flat function tools -> chat completions' `{"type": "function", "function": {...}}`."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise APIError(400, _("tools[{i}]: tool type {kind} is not supported by this server (function tools "
                                  "only).").format(i=i, kind=repr(kind)), param=f"tools[{i}].type")
        fn = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(choice: Any) -> Any:
    """Responses' tool_choice (`{"type": "function", "name": ...}` when named) -> chat completions'."""
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def text_format(text: Any) -> Any:
    """`text.format` -> chat completions' `response_format` (None for plain text)."""
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type", "text") == "text":
        return None
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name", "output"), "schema": fmt.get("schema", {}),
                                                       "strict": fmt.get("strict")}}
    return {"type": fmt.get("type")}


def reasoning_item(text: str, item_id: str | None = None) -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id or new_id("rs"), "summary": [],
            "content": [{"type": "reasoning_text", "text": text}], "status": "completed"}


def message_item(text: str, item_id: str | None = None, status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": item_id or new_id("msg"), "role": "assistant", "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def call_item(call: ToolCall, item_id: str | None = None) -> dict[str, Any]:
    return {"type": "function_call", "id": item_id or new_id("fc"), "call_id": call.id, "name": call.name,
            "arguments": call.arguments, "status": "completed"}


def calculator_item(step: CalculatorStep) -> dict[str, Any]:
    """A built-in calculator step as OpenAI's server-side python tool item: the code and its output."""
    outputs = [{"type": "logs", "logs": step.result}] if step.result is not None else []
    return {"type": "code_interpreter_call", "id": new_id("ci"), "code": step.expression, "container_id": "calculator",
            "outputs": outputs, "status": "completed"}


def output_items(reasoning: str | None, text: str, calls: list[ToolCall],
                 steps: tuple[CalculatorStep, ...] | list[CalculatorStep] = ()) -> list[dict[str, Any]]:
    items = [reasoning_item(reasoning)] if reasoning is not None else []
    items += [calculator_item(step) for step in steps]
    if text or not calls:
        items.append(message_item(text))
    return items + [call_item(c) for c in calls]
