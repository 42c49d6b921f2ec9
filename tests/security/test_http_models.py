"""Clients cannot take models from each other: a request's keep_alive holds after that request only, and
the models given at start-up are unloaded by no client unless the server runs with --allow-unload."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.security.http_helpers import assert_error, assert_healthy, start_two_models, statuses
from tests.serve.api_testing import chat_tokenizer


@pytest.fixture(scope="module")
def tok(small_tokenizer):
    return chat_tokenizer(small_tokenizer)


def complete(url: str, model: str, **extra) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 2, **extra},
                      timeout=30)


def keep_alive_of(url: str, model: str) -> str:
    return next(m["keep_alive"] for m in httpx.get(f"{url}/v1/models", timeout=10).json()["data"] if m["id"] == model)


def test_a_requests_keep_alive_does_not_change_the_next_requests(tok):
    server = start_two_models(tok, keep_alive=0.5)
    try:
        assert complete(server.url, "b", keep_alive=-1).status_code == 200
        assert keep_alive_of(server.url, "b") == "kept loaded"
        time.sleep(1.0)
        assert statuses(server.url)["b"] == "loaded"  # that request's keep_alive: kept
        assert complete(server.url, "b").status_code == 200  # the next one sets none: the server's 0.5 s
        assert keep_alive_of(server.url, "b") == "unloaded after 0.5 s idle"
        deadline = time.monotonic() + 10
        while statuses(server.url)["b"] != "available":
            assert time.monotonic() < deadline, "b stayed loaded past the default keep-alive"
            time.sleep(0.1)
        assert_healthy(server.url)
    finally:
        server.stop()


def test_clients_cannot_unload_a_start_up_model_without_allow_unload(tok):
    server = start_two_models(tok)
    try:
        error = assert_error(httpx.post(f"{server.url}/models/unload", json={"model": "a"}, timeout=30), 403,
                             "unload_not_allowed")
        assert "--allow-unload" in error["message"]
        error = assert_error(complete(server.url, "a", keep_alive=0), 403, "unload_not_allowed")
        assert error["param"] == "keep_alive"
        assert statuses(server.url)["a"] == "loaded"
        # a model loaded on demand is the clients' to unload
        assert complete(server.url, "b", keep_alive=0).status_code == 200
        assert httpx.post(f"{server.url}/models/unload", json={"model": "b"}, timeout=30).status_code == 200
        assert_healthy(server.url)
    finally:
        server.stop()

    server = start_two_models(tok, allow_unload=True)
    try:
        r = httpx.post(f"{server.url}/models/unload", json={"model": "a"}, timeout=30)
        assert r.status_code == 200 and r.json()["status"] == "available"
    finally:
        server.stop()
