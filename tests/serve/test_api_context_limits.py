"""Context limits are the engine's check (engine/limits.py), reported the same way by every route:
chat completions, completions, Anthropic's messages and the Responses API answer a request past the
context with the same 400 message, naming each route's own fields."""

from __future__ import annotations

import re

import httpx
import pytest
from api_testing import chat_tokenizer, served_tiny, start_server

from portachat.engine.limits import ContextLengthError
from portachat.serve.api.request_params import context_error

LIMIT = 256
HELLO = "Hello there, how are you today?"
LONG = "word " * 400  # past the 256-token window on its own
# route -> (path, body for a prompt and a reply length, the prompt's field, the length's field, usage's prompt key)
ROUTES = {
    "chat": ("/v1/chat/completions", lambda text, n: {"messages": [{"role": "user", "content": text}], "max_tokens": n},
             "messages", "max_tokens", "prompt_tokens"),
    "completions": ("/v1/completions", lambda text, n: {"prompt": text, "max_tokens": n}, "prompt", "max_tokens",
                    "prompt_tokens"),
    "messages": ("/v1/messages", lambda text, n: {"messages": [{"role": "user", "content": text}], "max_tokens": n},
                 "messages", "max_tokens", "input_tokens"),
    "responses": ("/v1/responses", lambda text, n: {"input": text, "max_output_tokens": n, "store": False},
                  "input", "max_tokens", "input_tokens"),
}


@pytest.fixture(scope="module")
def server(small_tokenizer):
    running = start_server(served_tiny(chat_tokenizer(small_tokenizer), max_model_len=LIMIT))
    yield running
    running.stop()


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json={"model": "tiny", **body}, timeout=60)


def _message(reply: httpx.Response) -> tuple[str, str | None, str | None]:
    error = reply.json()["error"]
    return error["message"], error.get("param"), error.get("code")


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_every_route_reports_the_engines_context_refusal_in_the_same_words(server, route):
    path, body, prompt_param, length_param, usage_key = ROUTES[route]
    fits = _post(server, path, body(HELLO, 1))
    assert fits.status_code == 200, fits.text
    prompt_tokens = fits.json()["usage"][usage_key]
    for text, n, max_tokens in ((HELLO, 100_000, 100_000), (LONG, 1, None)):
        reply = _post(server, path, body(text, n))
        assert reply.status_code == 400
        message, param, code = _message(reply)
        # The prompt alone past the window: its length as the message gives it (more than the window holds).
        tokens = prompt_tokens if text == HELLO else int(re.search(r"has (\d+) tokens", message).group(1))
        assert tokens > LIMIT or text == HELLO
        want = context_error(ContextLengthError(tokens, max_tokens, LIMIT), prompt_param, length_param)
        assert message == want.message
        if route != "messages":  # Anthropic's error shape has no param or code
            assert (param, code) == (want.param, "context_length_exceeded")
