"""LoRA adapters as models of a real server: requests name them through the `openai` client, the base
and its adapters share batches, and each adapter answers as its merged model does (greedy, fp32)."""

from __future__ import annotations

import copy
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from portachat.model.lora import load_lora, merge_into
from portachat.serve.api import ServerSettings, create_app
from portachat.serve.registry import ModelRegistry, ModelSpec
from tests.lora_files import write_random_adapter
from tests.serve.api_testing import chat_tokenizer, metric, served_tiny, tiny_model, wait_healthy
from tests.serve.threaded_server import serve_in_thread

PROMPTS = ["the king", "my lord, the", "what say you", "O, speak"]


@pytest.fixture(scope="module")
def tokenizer(small_tokenizer):
    return chat_tokenizer(small_tokenizer)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("served_adapters")
    base = tiny_model(tokenizer.vocab_size, seed=5)
    return {"x": write_random_adapter(root / "x", base, rank=4, alpha=8, seed=11),
            "y": write_random_adapter(root / "y", base, rank=2, alpha=4, targets=("q_proj", "down_proj"), seed=12)}


def start(tokenizer, adapters, step_delay_s: float = 0.0):
    engines = {}

    def load(spec: ModelSpec):
        model = tiny_model(tokenizer.vocab_size, seed=5)
        if spec.name.endswith("_merged"):  # the reference: the adapter folded into the weights
            model = merge_into(copy.deepcopy(model), load_lora(adapters[spec.name.removesuffix("_merged")]))
        served = served_tiny(tokenizer, model=model.requires_grad_(False))
        if step_delay_s:  # slow steps: concurrent requests meet in the running batch
            step = served.engine.step
            served.engine.step = lambda: (time.sleep(step_delay_s), step())[1]
        engines[spec.name] = served.engine
        return served

    specs = [ModelSpec("base", "", pinned=True), ModelSpec("x", str(adapters["x"]), pinned=True, base="base"),
             ModelSpec("y", str(adapters["y"]), base="base"), ModelSpec("x_merged", ""), ModelSpec("y_merged", "")]
    registry = ModelRegistry(specs, load)
    # --allow-unload: a test below unloads the start-up base by hand
    server = serve_in_thread(create_app(ServerSettings(served_model_name="base", allow_unload=True), registry=registry))
    wait_healthy(server.url)
    return server, registry, engines


def reply(client: openai.OpenAI, model: str, prompt: str, **extra) -> str:
    out = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0, extra_body=extra)
    assert out.model == model
    return out.choices[0].text


def cards(url: str) -> dict[str, dict]:
    return {m["id"]: m for m in httpx.get(f"{url}/v1/models", timeout=10).json()["data"]}


def test_adapters_are_models_that_share_batches_and_answer_as_merged(tokenizer, adapters):
    server, registry, engines = start(tokenizer, adapters, step_delay_s=0.02)
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        listed = cards(server.url)
        assert listed["x"]["parent"] == "base" and listed["y"]["parent"] == "base"
        assert listed["x"]["status"] == "loaded" and listed["y"]["status"] == "available"  # y: on demand
        assert "parent" not in listed["base"]
        jobs = [(m, p) for p in PROMPTS for m in ("base", "x", "y")]
        with ThreadPoolExecutor(len(jobs)) as pool:
            got = list(pool.map(lambda job: reply(client, *job), jobs))
        stats = engines["base"].stats()
        assert stats["lora_adapters"] == ["x", "y"]
        assert stats["lora_mixed_steps"] > 0  # base and adapter rows ran in the same steps
        assert 0 < metric(server.url, "portachat:lora_mixed_steps") <= stats["lora_mixed_steps"]
        text = httpx.get(f"{server.url}/metrics", timeout=10).text  # each adapter's requests under its name
        assert 'portachat:request_success_total{finished_reason="length",model_name="x"} 4.0' in text
        assert 'portachat:request_success_total{finished_reason="length",model_name="base"} 4.0' in text
        expected = [reply(client, m if m == "base" else f"{m}_merged", p) for m, p in jobs]
        assert got == expected
        assert len({got[0], got[1], got[2]}) == 3  # each adapter changes the answer
        # chat completions name adapters the same way
        chat = client.chat.completions.create(model="y", messages=[{"role": "user", "content": "hello"}],
                                              max_tokens=6, temperature=0)
        merged = client.chat.completions.create(model="y_merged", messages=[{"role": "user", "content": "hello"}],
                                                max_tokens=6, temperature=0)
        assert chat.choices[0].message.content == merged.choices[0].message.content
        # adapters ride on their base: loaded, yet not models that count towards limits or eviction
        assert "base" in [e.name for e in registry.loaded()] and registry.get("y").state == "loaded"
        assert not {"x", "y"} & {e.name for e in registry.loaded()}
    finally:
        server.stop()


def test_adapters_leave_by_keep_alive_and_with_their_base(tokenizer, adapters):
    server, registry, engines = start(tokenizer, adapters)
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        first = reply(client, "y", PROMPTS[0], keep_alive=0)
        deadline = time.monotonic() + 10
        while cards(server.url)["y"]["status"] != "available":
            assert time.monotonic() < deadline, "keep_alive 0 did not drop the adapter"
            time.sleep(0.05)
        assert engines["base"].adapters == ["x"] and cards(server.url)["base"]["status"] == "loaded"
        assert httpx.post(f"{server.url}/models/unload", json={"model": "base"}, timeout=10).status_code == 200
        assert {cards(server.url)[n]["status"] for n in ("base", "x", "y")} == {"available"}
        assert reply(client, "y", PROMPTS[0]) == first  # loads the base again, then the adapter
        assert cards(server.url)["base"]["status"] == "loaded"
        with pytest.raises(openai.NotFoundError):
            reply(client, "z", PROMPTS[0])
    finally:
        server.stop()
