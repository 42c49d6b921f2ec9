"""LoRA adapters added and removed while the server runs (vLLM's POST /v1/load_lora_adapter and
/v1/unload_lora_adapter): a row added at run time answers as the same adapter given at start-up,
removal waits for the adapter's requests, admin-only with keys, and the refusals. Slow: a real
`portachat serve` process and the `openai` client."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from portachat.model.model_dir import save_model_files
from portachat.serve.api import ServerSettings, create_app
from portachat.serve.registry import ModelRegistry, ModelSpec
from tests.lora_files import write_random_adapter
from tests.serve.api_testing import chat_tokenizer, free_port, served_tiny, tiny_model, wait_healthy
from tests.serve.threaded_server import serve_in_thread

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def tokenizer(small_tokenizer):
    return chat_tokenizer(small_tokenizer)


@pytest.fixture(scope="module")
def adapter(tmp_path_factory, tokenizer) -> Path:
    return write_random_adapter(tmp_path_factory.mktemp("adapters") / "x", tiny_model(tokenizer.vocab_size, seed=5),
                                rank=4, alpha=8, seed=11)


def start(tokenizer, adapter: Path, **settings):
    specs = [ModelSpec("base", "", pinned=True), ModelSpec("x", str(adapter), pinned=True, base="base")]
    registry = ModelRegistry(specs, lambda spec: served_tiny(tokenizer, model=tiny_model(tokenizer.vocab_size, seed=5)))
    server = serve_in_thread(create_app(ServerSettings(served_model_name="base", **settings), registry=registry))
    wait_healthy(server.url)
    return server, registry


def text(url: str, model: str, max_tokens: int = 8, **headers) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", headers=headers, timeout=60, json={
        "model": model, "prompt": "the king", "max_tokens": max_tokens, "temperature": 0})


def test_an_adapter_loaded_at_run_time_answers_as_the_start_up_one_and_leaves(tokenizer, adapter):
    server, registry = start(tokenizer, adapter)
    try:
        url = server.url
        assert text(url, "late").status_code == 404
        loaded = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "late", "lora_path": str(adapter)})
        assert loaded.status_code == 200 and loaded.text == "Success: LoRA adapter 'late' added successfully."
        assert registry.get("late").state == "loaded"  # in the base's engine before the next request
        answers = {m: text(url, m).json()["choices"][0]["text"] for m in ("base", "x", "late")}
        assert answers["late"] == answers["x"] != answers["base"]
        card = next(m for m in httpx.get(f"{url}/v1/models").json()["data"] if m["id"] == "late")
        assert card["parent"] == "base" and card["root"] == str(adapter)
        again = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "late", "lora_path": str(adapter)})
        assert again.status_code == 400 and "already been loaded" in again.json()["error"]["message"]
        nowhere = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "y", "lora_path": str(adapter.parent)})
        assert nowhere.status_code == 400 and nowhere.json()["error"]["param"] == "lora_path"

        removed = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "late"})
        assert removed.status_code == 200 and removed.text == "Success: LoRA adapter 'late' removed successfully."
        assert "late" not in registry.entries and text(url, "late").status_code == 404
        assert "late" not in registry.get("base").served.engine.adapters
        assert text(url, "x").json()["choices"][0]["text"] == answers["x"]  # the start-up adapter stays
        unknown = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "late"})
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
        pinned = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "x"})
        assert pinned.status_code == 403 and "--allow-unload" in pinned.json()["error"]["message"]
        base = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "base"})
        assert base.status_code == 404  # a model is not an adapter
    finally:
        server.stop()


def test_an_adapter_in_use_finishes_its_requests_before_it_goes(tokenizer, adapter):
    server, registry = start(tokenizer, adapter)
    try:
        url = server.url
        assert httpx.post(f"{url}/v1/load_lora_adapter",
                          json={"lora_name": "late", "lora_path": str(adapter)}).status_code == 200
        engine = registry.get("base").served.engine
        step = engine.step
        engine.step = lambda: (time.sleep(0.01), step())[1]  # a reply of 40 tokens takes ~0.4 s
        events: dict[str, float] = {}
        reply: dict = {}

        def long_request() -> None:
            reply.update(text(url, "late", max_tokens=40).json())
            events["reply"] = time.monotonic()

        worker = threading.Thread(target=long_request)
        worker.start()
        while registry.get("late").in_flight == 0:
            time.sleep(0.005)
        removed = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "late"}, timeout=30)
        events["removed"] = time.monotonic()
        worker.join()
        assert removed.status_code == 200
        assert reply["choices"][0]["finish_reason"] == "length" and reply["usage"]["completion_tokens"] == 40
        assert events["reply"] <= events["removed"] + 0.05  # the unload waited for the request
        assert "late" not in engine.adapters
    finally:
        server.stop()


def test_with_keys_only_the_admin_key_adds_or_removes_adapters(tokenizer, adapter):
    server, registry = start(tokenizer, adapter, api_keys=["user"], admin_api_key="boss")
    try:
        body = {"lora_name": "late", "lora_path": str(adapter)}
        user = httpx.post(f"{server.url}/v1/load_lora_adapter", json=body, headers={"Authorization": "Bearer user"})
        assert user.status_code == 403 and user.json()["error"]["code"] == "admin_key_required"
        admin = httpx.post(f"{server.url}/v1/load_lora_adapter", json=body, headers={"Authorization": "Bearer boss"})
        assert admin.status_code == 200 and "late" in registry.entries
        user = httpx.post(f"{server.url}/v1/unload_lora_adapter", json={"lora_name": "late"},
                          headers={"Authorization": "Bearer user"})
        assert user.status_code == 403 and "late" in registry.entries
    finally:
        server.stop()


def test_a_request_cannot_start_a_hub_download(tokenizer, adapter, monkeypatch):
    # The model resolver downloads hf:/modelscope: ids; a client's lora_path must name the server's disk.
    started = []
    monkeypatch.setattr("portachat.model.source._hub_download", lambda spec: started.append(spec))
    server, registry = start(tokenizer, adapter)
    try:
        for path in ("hf:someone/adapter", "modelscope:someone/adapter"):
            r = httpx.post(f"{server.url}/v1/load_lora_adapter", json={"lora_name": "far", "lora_path": path})
            assert r.status_code == 400 and r.json()["error"]["param"] == "lora_path", r.text
            assert "not a directory on the server" in r.json()["error"]["message"]
        assert started == [] and "far" not in registry.entries
    finally:
        server.stop()


def test_registry_rows_for_adapters_need_a_served_base_and_a_free_name(tokenizer, adapter):
    registry = ModelRegistry([ModelSpec("base", "")], lambda spec: None)
    with pytest.raises(ValueError, match="not a served model"):
        registry.add_adapter(ModelSpec("a", str(adapter), base="nobody"))
    with pytest.raises(ValueError, match="already served"):
        registry.add_adapter(ModelSpec("base", str(adapter), base="base"))
    entry = registry.add_adapter(ModelSpec("a", str(adapter), base="base"))
    assert registry.names() == ["base", "a"] and entry.state == "available" and entry.is_adapter
    with pytest.raises(ValueError, match="not a LoRA adapter"):
        asyncio.run(registry.remove_adapter("base"))
    asyncio.run(registry.remove_adapter("a"))  # never loaded: the row just goes
    assert registry.names() == ["base"]


@pytest.mark.slow
def test_serve_process_loads_an_adapter_at_run_time_that_equals_the_start_up_one(tmp_path, small_tokenizer):
    model = tiny_model(small_tokenizer.vocab_size, seed=4)
    base = tmp_path / "base"
    base.mkdir()
    save_model_files(base, model, small_tokenizer, meta={"stage": "test"})
    adapter = write_random_adapter(tmp_path / "tuned", model, rank=4, alpha=8, seed=1, base=str(base))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "portachat", "serve", "--model", f"base={base}",
                             "--lora", f"tuned={adapter}", "--port", str(port), "--dtype", "fp32",
                             "--kv-cache-gb", "0.01", "--max-model-len", "256", "--api-key", "user",
                             "--admin-api-key", "boss"],
                            cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, timeout_s=120)
        admin = {"Authorization": "Bearer boss"}
        body = {"lora_name": "late", "lora_path": str(adapter)}
        assert httpx.post(f"{url}/v1/load_lora_adapter", json=body, headers={"Authorization": "Bearer user"}
                          ).status_code == 403
        assert httpx.post(f"{url}/v1/load_lora_adapter", json=body, headers=admin, timeout=60).status_code == 200
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="user", max_retries=0, timeout=60)

        def reply(name: str) -> str:
            return client.completions.create(model=name, prompt="the king", max_tokens=8, temperature=0).choices[0].text

        assert reply("late") == reply("tuned") != reply("base")
        assert httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "late"}, headers=admin).status_code == 200
        with pytest.raises(openai.NotFoundError):
            reply("late")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
