"""Real servers for the HTTP security probes: a tiny random model in the real engine behind uvicorn on a
free loopback port (tests/serve/api_testing.py's parts), and the checks every probe ends with.

(A uniquely named module, not a conftest: other files in tests/security bring their own helpers.)
"""

from __future__ import annotations

from typing import Any

import httpx

from portachat.serve.api import ServerSettings, create_app
from portachat.serve.registry import ModelRegistry, ModelSpec
from tests.serve.api_testing import metric, served_tiny, start_server, tiny_model, wait_healthy
from tests.serve.threaded_server import RunningServer, serve_in_thread

HELLO = [{"role": "user", "content": "Hello there"}]
CHAT = {"model": "tiny", "messages": HELLO, "max_tokens": 2}


def start_tiny(tokenizer, **settings: Any) -> RunningServer:
    """One model, "tiny", loaded at start-up."""
    return start_server(served_tiny(tokenizer), **settings)


def start_two_models(tokenizer, keep_alive: float | None = None, **settings: Any) -> RunningServer:
    """"a" given at start-up (pinned), "b" loaded on demand; `keep_alive` is the server's default."""
    specs = [ModelSpec("a", "", pinned=True), ModelSpec("b", "")]
    seeds = {"a": 1, "b": 2}
    registry = ModelRegistry(specs, lambda spec: served_tiny(tokenizer, model=tiny_model(tokenizer.vocab_size,
                                                                                         seed=seeds[spec.name])),
                             keep_alive=keep_alive)
    server = serve_in_thread(create_app(ServerSettings(served_model_name="a", **settings), registry=registry))
    wait_healthy(server.url)
    return server


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict:
    """`status` with OpenAI's error body (and `code`, when given); returns the error object."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if code is not None:
        assert error["code"] == code, error
    return error


def assert_healthy(url: str) -> None:
    """The server still answers after a probe."""
    r = httpx.get(f"{url}/health", timeout=10)
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def tokens_processed(url: str, headers: dict | None = None) -> float:
    """Prompt plus generated tokens so far: 0 means the engine never ran a request."""
    return metric(url, "portachat:prompt_tokens_total", headers) + metric(url, "portachat:generation_tokens_total",
                                                                        headers)


def statuses(url: str, headers: dict | None = None) -> dict[str, str]:
    return {m["id"]: m["status"] for m in httpx.get(f"{url}/v1/models", headers=headers, timeout=10).json()["data"]}
