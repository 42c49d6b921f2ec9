"""Many models behind one real server: load on demand, LRU eviction, in-flight protection, keep-alive,
the load/unload routes and per-model metrics, through the `openai` client and plain HTTP."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from portachat.serve.api import ServerSettings, create_app
from portachat.serve.registry import ModelRegistry, ModelSpec
from portachat.serve.registry.registry import served_memory_bytes
from tests.serve.api_testing import chat_tokenizer, metric, served_tiny, tiny_model, wait_healthy
from tests.serve.threaded_server import serve_in_thread

SEEDS = {"a": 1, "b": 2, "c": 3}


@pytest.fixture(scope="module")
def tokenizer(small_tokenizer):
    return chat_tokenizer(small_tokenizer)


def start(tokenizer, step_delay_s: float = 0.0, **registry_options):
    loads: list[str] = []

    def load(spec: ModelSpec):
        loads.append(spec.name)
        served = served_tiny(tokenizer, model=tiny_model(tokenizer.vocab_size, seed=SEEDS[spec.name]))
        if step_delay_s:  # a slow device: requests stay in flight long enough to race against
            step = served.engine.step
            served.engine.step = lambda: (time.sleep(step_delay_s), step())[1]
        return served

    specs = [ModelSpec("a", "", pinned=True), ModelSpec("b", ""), ModelSpec("c", "")]
    registry = ModelRegistry(specs, load, **registry_options)
    server = serve_in_thread(create_app(ServerSettings(served_model_name="a"), registry=registry))
    wait_healthy(server.url)
    return server, loads


def states(url: str) -> dict[str, str]:
    return {m["id"]: m["status"] for m in httpx.get(f"{url}/v1/models", timeout=10).json()["data"]}


def reply(client: openai.OpenAI, model: str, **extra) -> str:
    out = client.completions.create(model=model, prompt="the king", max_tokens=8, temperature=0, extra_body=extra)
    assert out.model == model
    return out.choices[0].text


def wait_for(check, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_models_load_on_demand_and_the_least_recently_used_idle_one_is_evicted(tokenizer):
    server, loads = start(tokenizer, max_loaded=2)
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        assert states(server.url) == {"a": "loaded", "b": "available", "c": "available"}
        first_a = reply(client, "a")
        first_b = reply(client, "b")
        assert first_a != first_b  # different weights answer differently
        assert states(server.url) == {"a": "loaded", "b": "loaded", "c": "available"}
        reply(client, "a")  # a is now the most recently used
        reply(client, "c")  # one too many: b, the least recently used, goes
        assert states(server.url) == {"a": "loaded", "b": "available", "c": "loaded"}
        assert reply(client, "b") == first_b  # reloaded from its loader: the same model
        assert loads == ["a", "b", "c", "b"]
        assert metric(server.url, "portachat:model_loaded") == 2
        text = httpx.get(f"{server.url}/metrics", timeout=10).text
        assert 'portachat:model_unloads_total{model_name="b",reason="evicted"} 1.0' in text
        assert 'portachat:generation_tokens_total{model_name="c"}' in text
        # no model named: the default (first) one; an unknown one: 404 naming what exists
        assert client.completions.create(prompt="the king", max_tokens=8, temperature=0,
                                         model="").choices[0].text == first_a
        with pytest.raises(openai.NotFoundError, match="'a', 'b', 'c'"):
            reply(client, "zzz")
    finally:
        server.stop()


def test_a_model_with_requests_in_flight_is_never_evicted(tokenizer):
    server, _ = start(tokenizer, step_delay_s=0.05, max_loaded=1)
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        # A stream holds its model until it ends: 100 steps of 50 ms outlast the request below.
        stream = client.completions.create(model="a", prompt="the king", max_tokens=100, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True})
        next(iter(stream))
        r = httpx.post(f"{server.url}/v1/completions", json={"model": "b", "prompt": "hi", "max_tokens": 4}, timeout=30)
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"] and "a (1 in flight" in r.json()["error"]["message"]
        assert "--max-loaded-models" in r.json()["error"]["message"]
        assert len("".join(c.choices[0].text for c in stream)) > 0
        stream.close()
        assert reply(client, "b")  # once a is idle it makes room
        assert states(server.url) == {"a": "available", "b": "loaded", "c": "available"}
    finally:
        server.stop()


def test_keep_alive_zero_unloads_after_the_request_and_a_default_expires(tokenizer):
    server, _ = start(tokenizer, keep_alive=0.5)
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        reply(client, "b", keep_alive=0)
        wait_for(lambda: states(server.url)["b"] == "available", 5)
        reply(client, "c", keep_alive="-1")  # kept: outlives the 0.5 s default
        wait_for(lambda: states(server.url)["a"] == "available", 5)  # the default keep-alive ran out
        time.sleep(1.0)
        assert states(server.url)["c"] == "loaded"
        r = httpx.post(f"{server.url}/v1/completions", json={"model": "b", "prompt": "hi", "keep_alive": "soon"},
                       timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "keep_alive"
    finally:
        server.stop()


def test_load_and_unload_routes(tokenizer):
    server, loads = start(tokenizer)
    try:
        r = httpx.post(f"{server.url}/models/load", json={"model": "c"}, timeout=30)
        assert r.status_code == 200 and r.json() == {"success": True, "model": "c", "status": "loaded"}
        assert states(server.url)["c"] == "loaded" and loads == ["a", "c"]
        r = httpx.post(f"{server.url}/models/unload", json={"model": "c"}, timeout=30)
        assert r.status_code == 200 and r.json()["status"] == "available"
        assert states(server.url)["c"] == "available"
        assert httpx.post(f"{server.url}/models/load", json={"model": "nope"}, timeout=30).status_code == 404
        assert httpx.post(f"{server.url}/models/unload", json={}, timeout=30).status_code == 400
        card = next(m for m in httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"] if m["id"] == "a")
        assert card["max_model_len"] == 256 and card["size_bytes"] > 0
    finally:
        server.stop()


def test_a_memory_budget_evicts_like_a_count_limit(tokenizer):
    # each tiny model measures at `size` bytes: a budget of 2.5 models holds two
    probe = served_tiny(tokenizer)
    size = served_memory_bytes(probe)
    probe.engine = None
    server, _ = start(tokenizer, budget_bytes=int(size * 2.5))
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        reply(client, "b")
        assert states(server.url) == {"a": "loaded", "b": "loaded", "c": "available"}
        reply(client, "c")
        assert states(server.url) == {"a": "available", "b": "loaded", "c": "loaded"}
    finally:
        server.stop()
