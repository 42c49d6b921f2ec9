"""Hostile bodies get a 400 naming the problem, never a 500, and the server goes on: JSON nested 100k
deep, a seed past 64 bits, more Anthropic messages than --max-messages."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from tests.security.http_helpers import (
    CHAT,
    HELLO,
    assert_error,
    assert_healthy,
    start_tiny,
    tokens_processed,
)
from tests.serve.api_testing import chat_tokenizer


@pytest.fixture(scope="module")
def server(small_tokenizer):
    running = start_tiny(chat_tokenizer(small_tokenizer), max_messages=3)
    yield running
    running.stop()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/embeddings",
                                  "/models/load"])
def test_json_nested_100k_deep_is_400(server, path):
    deep = b'{"model": "tiny", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    r = httpx.post(f"{server.url}{path}", content=deep, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]  # OpenAI's shape, or Anthropic's on /v1/messages
    assert "too deeply" in message
    assert_healthy(server.url)


@pytest.mark.parametrize("seed", [2**80, -(2**70)])
def test_a_seed_past_64_bits_is_400(server, seed):
    for path, body in [("/v1/chat/completions", CHAT), ("/v1/completions", {"model": "tiny", "prompt": "hi",
                                                                               "max_tokens": 2})]:
        r = httpx.post(f"{server.url}{path}", json={**body, "seed": seed}, timeout=60)
        assert assert_error(r, 400)["param"] == "seed"
    # the largest 64-bit seed still samples, with n choices seeded seed, seed+1, ...
    r = httpx.post(f"{server.url}/v1/chat/completions", json={**CHAT, "seed": 2**63 - 1, "n": 2, "temperature": 1},
                   timeout=60)
    assert r.status_code == 200, r.text
    assert_healthy(server.url)


def test_anthropic_messages_honour_max_messages(server):
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
    before = tokens_processed(server.url)
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="tiny", max_tokens=2, messages=HELLO * 4)
    assert caught.value.status_code == 400
    assert caught.value.body["type"] == "error" and "--max-messages" in caught.value.body["error"]["message"]
    assert tokens_processed(server.url) == before
    three = [*HELLO, {"role": "assistant", "content": "Hi"}, *HELLO]  # at the limit: answered
    assert client.messages.create(model="tiny", max_tokens=2, messages=three).content is not None
    assert_healthy(server.url)
