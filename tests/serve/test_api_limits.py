"""Limits and failures answered in OpenAI's shape while the server keeps serving: API key, CORS, a full
queue, a device error inside a step, graceful shutdown."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest
import torch
from api_testing import chat_tokenizer, metric, served_tiny, start_server, tiny_model, wait_idle

from portachat.serve.api import begin_graceful_shutdown

HELLO = [{"role": "user", "content": "Hello there, good sir"}]


@pytest.fixture(scope="module")
def tok(small_tokenizer):
    return chat_tokenizer(small_tokenizer)


def test_api_key_guards_every_route_but_health_and_cors_preflight(tok):
    server = start_server(served_tiny(tok), api_keys=["sekret"], cors_origins=["http://page.test"], max_messages=3)
    try:
        url = server.url
        assert httpx.get(f"{url}/health").status_code == 200
        for method, path in [("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
                             ("GET", "/metrics")]:
            r = httpx.request(method, f"{url}{path}", json={})
            assert r.status_code == 401, path
            assert r.json()["error"]["code"] == "invalid_api_key" and "--api-key" in r.json()["error"]["message"]
            r = httpx.request(method, f"{url}{path}", json={}, headers={"Authorization": "Bearer wrong"})
            assert r.status_code == 401 and "Invalid API key" in r.json()["error"]["message"]
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()
        good = openai.OpenAI(base_url=f"{url}/v1", api_key="sekret", max_retries=0, timeout=60)
        assert good.chat.completions.create(model="tiny", messages=HELLO, max_tokens=3).choices
        assert metric(url, "portachat:request_success_total", {"Authorization": "Bearer sekret"}) == 1
        with pytest.raises(openai.BadRequestError) as caught:  # --max-messages 3
            good.chat.completions.create(model="tiny", messages=HELLO * 4, max_tokens=3)
        assert caught.value.body["param"] == "messages" and "--max-messages" in caught.value.body["message"]
        # The page itself holds no data: it loads without a key and asks for one.
        assert httpx.get(f"{url}/").status_code == 200
        preflight = httpx.options(f"{url}/v1/chat/completions", headers={
            "Origin": "http://page.test", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"})
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "http://page.test"
        other = httpx.options(f"{url}/v1/chat/completions", headers={
            "Origin": "http://evil.test", "Access-Control-Request-Method": "POST"})
        assert "access-control-allow-origin" not in other.headers
    finally:
        server.stop()


async def _post_all(url: str, bodies: list[dict], timeout: float = 120) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=len(bodies))) as client:
        return await asyncio.gather(*(client.post(f"{url}/v1/completions", json=b) for b in bodies))


def test_full_queue_answers_429_and_the_rest_complete(tok):
    server = start_server(served_tiny(tok, max_num_seqs=2, max_waiting=3))
    try:
        body = {"model": "tiny", "prompt": "Once upon", "max_tokens": 40, "ignore_eos": True, "temperature": 1.0}
        responses = asyncio.run(_post_all(server.url, [body] * 24))
        codes = [r.status_code for r in responses]
        assert set(codes) <= {200, 429}, codes
        assert codes.count(429) >= 1 and codes.count(200) >= 3, codes
        for r in responses:
            if r.status_code == 429:
                error = r.json()["error"]
                assert error["code"] == "queue_full" and "--max-waiting" in error["message"]
                assert r.headers["retry-after"] == "1"
            else:
                assert r.json()["usage"]["completion_tokens"] == 40
        wait_idle(server.url)
        assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).status_code == 200
    finally:
        server.stop()


def test_device_error_in_a_step_fails_only_that_request(tok):
    """An out-of-memory inside the forward (a long prompt's prefill) fails that request with the device
    layer's diagnosis in OpenAI's shape; the engine goes on serving."""
    model = tiny_model(tok.vocab_size)

    def oom_on_long_batches(module, args):
        if args[0].numel() > 60:
            raise torch.OutOfMemoryError("out of memory: tried to allocate 64.00 GiB")

    model.model.embed_tokens.register_forward_pre_hook(oom_on_long_batches)
    server = start_server(served_tiny(tok, model=model, max_num_batched_tokens=256))
    try:
        long_prompt = [{"role": "user", "content": "word " * 80}]
        r = httpx.post(f"{server.url}/v1/chat/completions",
                       json={"model": "tiny", "messages": long_prompt, "max_tokens": 5}, timeout=60)
        assert r.status_code == 500, r.text
        error = r.json()["error"]
        assert error["type"] == "server_error" and "Out of memory" in error["message"]
        assert "--device-batch-size" in error["message"] or "what to do" in error["message"].lower()

        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60)
        with pytest.raises(openai.APIError) as caught:
            list(client.chat.completions.create(model="tiny", messages=long_prompt, max_tokens=5, stream=True))
        assert "Out of memory" in str(caught.value)
        assert client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=5).choices[0].message
        wait_idle(server.url)
        assert metric(server.url, 'portachat:request_success_total{finished_reason="error",model_name="tiny"}') == 2
    finally:
        server.stop()


def test_graceful_shutdown_ends_streams_cleanly_and_refuses_new_work(tok):
    served = served_tiny(tok, max_model_len=1024)
    server = start_server(served, shutdown_grace_s=0.0)
    app = server.server.config.app
    try:
        body = {"model": "tiny", "messages": HELLO, "max_tokens": 1000, "ignore_eos": True, "stream": True}
        with httpx.Client(timeout=60) as c, c.stream("POST", f"{server.url}/v1/chat/completions", json=body) as r:
            lines = r.iter_lines()
            next(lines)
            server.server._loop.call_soon_threadsafe(begin_graceful_shutdown, app)
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        last = json.loads(rest[-2][len("data: "):])
        assert last["choices"][0]["finish_reason"] == "abort"
        r = httpx.post(f"{server.url}/v1/chat/completions", json={**body, "stream": False}, timeout=30)
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
        deadline = time.monotonic() + 10
        while served.engine.has_unfinished() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not served.engine.has_unfinished()
    finally:
        server.stop()
