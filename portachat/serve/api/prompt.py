"""Request -> prompt ids: chat messages through the model's chat template, or a completion prompt."""

from __future__ import annotations

from typing import Any

from portachat.i18n import _
from portachat.serve.api.errors import APIError
from portachat.serve.api.protocol import ChatCompletionRequest, CompletionRequest
from portachat.serve.api.reasoning import template_variables
from portachat.serve.api.state import ModelLease
from portachat.serve.api.tool_calls import ToolRequest, template_messages
from portachat.tokenizer.protocol import ChatTokenizer


def chat_prompt(state: ModelLease, req: ChatCompletionRequest, tools: ToolRequest | None = None) -> list[int]:
    settings = state.settings
    if not req.messages:
        raise APIError(400, _("'messages' is empty: send at least one message, e.g. [{{\"role\": \"user\", "
                              "\"content\": \"Hello\"}}]."), param="messages")
    check_message_count(len(req.messages), settings.max_messages)
    messages = template_messages(req.messages)
    check_calculator_parts(messages, state.model.tokenizer)
    variables = template_variables(req.chat_template_kwargs, req.reasoning_effort)
    try:
        return state.model.tokenizer.render_prompt(messages, tools=tools.tools if tools else None,
                                                   **({"template_kwargs": variables} if variables else {}))
    except Exception as exc:  # noqa: BLE001 - a template's raise_exception or our format's checks
        raise APIError(400, _("The conversation cannot be rendered with this model's chat template: {exc}").format(
                              exc=exc),
                       param="messages") from None


def check_calculator_parts(messages: list[dict[str, Any]], tokenizer: ChatTokenizer) -> None:
    """400 for a calculator step sent to a model without the built-in calculator: only our chat format
    has its tool tokens, and a template would show the step as plain text or fail on it."""
    if tokenizer.tool_tokens is not None:
        return
    for i, message in enumerate(messages):
        if not isinstance(message["content"], str):  # parts are kept only for a calculator step
            raise APIError(400, _("messages[{i}] holds a built-in calculator step (python parts; in the Responses API "
                                  "a code_interpreter_call item), but this model has no calculator: only models in "
                                  "portachat's own chat format have one. Leave the step out of the conversation.").format(
                i=i), param=f"messages[{i}].content")


def check_message_count(count: int, limit: int) -> None:
    """400 past `--max-messages` (chat completions and Anthropic's messages alike)."""
    if count > limit:
        raise APIError(400, _("Too many messages: {count} (this server's limit is {limit}, `portachat serve "
                              "--max-messages`).").format(count=count, limit=limit), param="messages")


def completion_prompt(state: ModelLease, req: CompletionRequest) -> list[int]:
    prompt: Any = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) != 1:
            raise APIError(400, _("Batched prompts are not supported (got {count}): send one request per "
                                  "prompt; the server batches concurrent requests itself.").format(
                                  count=len(prompt)), param="prompt")
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
            raise APIError(400, _("Token id {token} is outside this model's vocabulary (0..{last}).").format(
                                  token=bad[0], last=tokenizer.vocab_size - 1),
                           param="prompt")
    if not ids:
        raise APIError(400, _("The prompt is empty: send some text or token ids."), param="prompt")
    return ids
