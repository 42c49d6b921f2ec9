"""Issue 16's acceptance run: two chat models and one embedding model (all-MiniLM-L6-v2) behind one
real server, under a memory budget that holds any two of them. Requests alternating over all three
are answered; the least recently used idle model is evicted and reloaded on demand; keep_alive 0
unloads after the request; models busy with streams are never evicted (their streams complete) and a
request that cannot be placed gets 503 + Retry-After. Checked through /v1/models and /metrics."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from portachat.engine.loading import LoadOptions, load_served_model
from portachat.serve.api import ServerSettings, create_app
from portachat.serve.registry import ModelRegistry, ModelSpec
from portachat.serve.registry.catalog import estimate_bytes
from portachat.serve.registry.registry import served_memory_bytes
from tests.minilm import minilm_dir
from tests.serve.api_testing import chat_tokenizer, metric, served_tiny, tiny_model, wait_healthy
from tests.serve.threaded_server import serve_in_thread

STEP_DELAY_S = 0.03  # a slow device: streams stay in flight long enough to race against


def _states(url: str) -> dict[str, str]:
    return {m["id"]: m["status"] for m in httpx.get(f"{url}/v1/models", timeout=30).json()["data"]}


def _wait_for(check, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


@pytest.mark.slow
def test_two_chat_models_and_an_embedding_model_share_a_two_model_budget(small_tokenizer):
    tok = chat_tokenizer(small_tokenizer)
    minilm = str(minilm_dir())

    def load(spec: ModelSpec):
        if spec.name == "minilm":
            return load_served_model(LoadOptions(model=minilm, dtype="fp32", device="cpu"), embedding_models=True)
        # A large KV cache (~16 MB) so that the chat models weigh something next to MiniLM's 90 MB.
        served = served_tiny(tok, model=tiny_model(tok.vocab_size, seed={"alpha": 1, "beta": 2}[spec.name]),
                             num_blocks=2000)
        step = served.engine.step
        served.engine.step = lambda: (time.sleep(STEP_DELAY_S), step())[1]
        return served

    tiny = served_memory_bytes(load(ModelSpec("alpha", "")))
    # MiniLM counts as its weights on disk until loaded, then as measured: the larger decides.
    big = max(served_memory_bytes(load(ModelSpec("minilm", ""))), estimate_bytes(ModelSpec("minilm", minilm)))
    budget = tiny + big + tiny // 2  # any two fit, all three never do
    # MiniLM's path gives the registry its size before the first load (its weights on disk).
    specs = [ModelSpec("alpha", "", pinned=True), ModelSpec("beta", ""), ModelSpec("minilm", minilm)]
    registry = ModelRegistry(specs, load, budget_bytes=budget)
    server = serve_in_thread(create_app(ServerSettings(served_model_name="alpha"), registry=registry))
    url = server.url
    try:
        wait_healthy(url)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120)

        def chat(model: str, **extra) -> str:
            out = client.completions.create(model=model, prompt="the king", max_tokens=4, temperature=0,
                                            extra_body=extra)
            return out.choices[0].text

        # Alternating requests over all three are answered; LRU idle models make room.
        first = {"alpha": chat("alpha"), "beta": chat("beta")}
        assert _states(url) == {"alpha": "loaded", "beta": "loaded", "minilm": "available"}
        vectors = client.embeddings.create(model="minilm", input=["国王说", "the king said"]).data
        assert len(vectors) == 2 and len(vectors[0].embedding) == 384
        assert _states(url) == {"alpha": "available", "beta": "loaded", "minilm": "loaded"}  # alpha was LRU
        assert chat("alpha") == first["alpha"]  # reloaded on demand: the same model
        assert _states(url) == {"alpha": "loaded", "beta": "available", "minilm": "loaded"}
        assert metric(url, "portachat:model_unloads_total") == 2
        assert metric(url, "portachat:model_loads_total") == 4  # alpha (start-up), beta, minilm, alpha

        # keep_alive 0: unloaded as soon as its request ends.
        client.embeddings.create(model="minilm", input=["x"], extra_body={"keep_alive": 0})
        _wait_for(lambda: _states(url)["minilm"] == "available")

        # Two streams hold both slots: the embedding model cannot be placed (503 + Retry-After), and
        # neither busy model is evicted; both streams complete.
        streams = [client.completions.create(model=m, prompt="the king", max_tokens=40, temperature=0,
                                             stream=True, extra_body={"ignore_eos": True})
                   for m in ("alpha", "beta")]
        heads = [next(iter(s)) for s in streams]
        assert all(h.choices[0].text is not None for h in heads)
        r = httpx.post(f"{url}/v1/embeddings", json={"model": "minilm", "input": "hi"}, timeout=60)
        assert r.status_code == 503 and r.headers["retry-after"], r.text
        assert "in flight" in r.json()["error"]["message"]
        assert _states(url) == {"alpha": "loaded", "beta": "loaded", "minilm": "available"}
        for s in streams:
            finish = [c.choices[0].finish_reason for c in s if c.choices]
            assert finish[-1] == "length"
        assert metric(url, "portachat:http_request_errors_total") >= 1
        # Once they are idle, the embedding model is placed again.
        assert client.embeddings.create(model="minilm", input=["again"]).data
        text = httpx.get(f"{url}/metrics", timeout=30).text
        assert 'portachat:model_unloads_total{model_name="minilm",reason="keep-alive"}' in text
        assert 'portachat:model_unloads_total{model_name="alpha",reason="evicted"}' in text
    finally:
        server.stop()
