"""POST /v1/embeddings on the real server: all-MiniLM-L6-v2 served as an embedding-only model, and a chat
checkpoint that also serves embeddings, both through the `openai` client (float and base64)."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import anthropic
import httpx
import numpy as np
import openai
import pytest
import torch
from api_testing import free_port, metric, start_server, tiny_model, wait_healthy

from portachat.engine.loading import LoadOptions, load_served_model
from portachat.model.model_dir import save_model_files
from tests.minilm import minilm_dir

TEXTS = ["The cat sits on the mat.", "A feline rests on a rug.", "Quarterly revenue grew by twelve percent."]


@pytest.fixture(scope="module")
def minilm_server():
    served = load_served_model(LoadOptions(model=str(minilm_dir()), device="cpu", dtype="fp32"), embedding_models=True)
    running = start_server(served, served_model_name="all-MiniLM-L6-v2")
    running.embedder = served.embedder
    yield running
    running.stop()


@pytest.fixture()
def client(minilm_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{minilm_server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_openai_client_float_and_base64_give_the_model_s_vectors(client, minilm_server):
    want = minilm_server.embedder.embed_texts(TEXTS)
    as_float = client.embeddings.create(model="all-MiniLM-L6-v2", input=TEXTS, encoding_format="float")
    as_base64 = client.embeddings.create(model="all-MiniLM-L6-v2", input=TEXTS)  # the client's default: base64
    for reply in (as_float, as_base64):
        assert reply.object == "list" and reply.model == "all-MiniLM-L6-v2"
        assert [d.index for d in reply.data] == [0, 1, 2] and all(d.object == "embedding" for d in reply.data)
        got = torch.tensor([d.embedding for d in reply.data])
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    tokens = sum(len(minilm_server.embedder.tokenize(t)) for t in TEXTS)
    assert as_float.usage.prompt_tokens == as_float.usage.total_tokens == tokens
    assert metric(minilm_server.url, "portachat:prompt_tokens_total") >= 2 * tokens
    # Similar sentences are closer than unrelated ones: the vectors mean something.
    v = torch.tensor([d.embedding for d in as_float.data])
    assert v[0] @ v[1] > v[0] @ v[2] + 0.3


def test_base64_is_little_endian_float32_on_the_wire(minilm_server):
    body = httpx.post(f"{minilm_server.url}/v1/embeddings",
                      json={"input": "hello", "encoding_format": "base64"}, timeout=60).json()
    raw = base64.b64decode(body["data"][0]["embedding"])
    assert len(raw) == 384 * 4
    vector = np.frombuffer(raw, dtype="<f4")
    assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-5


def test_every_input_form(client, minilm_server):
    embedder = minilm_server.embedder
    ids = embedder.encode("Hello world")
    one = client.embeddings.create(model="all-MiniLM-L6-v2", input="Hello world", encoding_format="float")
    as_ids = client.embeddings.create(model="all-MiniLM-L6-v2", input=ids, encoding_format="float")
    as_lists = client.embeddings.create(model="all-MiniLM-L6-v2", input=[ids, ids[:1]], encoding_format="float",
                                        user="someone")
    assert len(one.data) == len(as_ids.data) == 1 and len(as_lists.data) == 2
    torch.testing.assert_close(torch.tensor(as_ids.data[0].embedding), torch.tensor(one.data[0].embedding))
    torch.testing.assert_close(torch.tensor(as_lists.data[0].embedding), torch.tensor(one.data[0].embedding))
    assert as_ids.usage.prompt_tokens == len(ids) + 2  # [CLS] ... [SEP]


def _error(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def test_bad_requests_answer_400_naming_the_problem(minilm_server):
    url = f"{minilm_server.url}/v1/embeddings"

    def post(body: dict) -> httpx.Response:
        return httpx.post(url, json=body, timeout=60)

    r = post({"input": "word " * 300})
    error = _error(r)
    assert r.status_code == 400 and "maximum input length is 256 tokens" in error["message"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "input"
    r = post({"input": "hi", "dimensions": 128})
    assert r.status_code == 400 and "only makes 384-dimensional embeddings" in _error(r)["message"]
    assert _error(r)["param"] == "dimensions"
    assert post({"input": "hi", "dimensions": 384}).status_code == 200
    for body, words in [({"input": ""}, "Input 0 is empty"), ({"input": []}, "'input' is empty"),
                        ({"input": ["ok", ""]}, "Input 1 is empty"), ({}, "Missing required parameter: 'input'"),
                        ({"input": [1, "a"]}, "Invalid value for 'input'"),
                        ({"input": "hi", "encoding_format": "int8"}, "encoding_format"),
                        ({"input": [[101, 999999]]}, "Token id 999999 in input 0 is outside"),
                        ({"input": ["x"] * 2049}, "Too many inputs: 2049")]:
        r = post(body)
        assert r.status_code == 400 and words in _error(r)["message"], (body, r.text)
    r = post({"input": "hi", "model": "gpt-4"})
    assert r.status_code == 404 and _error(r)["code"] == "model_not_found"


def test_an_embedding_model_refuses_generation_in_each_api_s_error_shape(client, minilm_server):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="all-MiniLM-L6-v2", messages=[{"role": "user", "content": "hi"}])
    assert "embedding model" in err.value.message and "/v1/embeddings" in err.value.message
    assert err.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        client.completions.create(model="all-MiniLM-L6-v2", prompt="hi")
    claude = anthropic.Anthropic(base_url=minilm_server.url, api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(anthropic.BadRequestError) as err:
        claude.messages.create(model="all-MiniLM-L6-v2", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert err.value.body["type"] == "error" and "embedding model" in err.value.body["error"]["message"]
    assert httpx.get(f"{minilm_server.url}/health", timeout=10).json() == {"status": "ok"}
    models = client.models.list().data
    assert [m.id for m in models] == ["all-MiniLM-L6-v2"] and models[0].max_model_len == 256


def test_commands_that_generate_refuse_an_embedding_model():
    with pytest.raises(ValueError, match="is an embedding model: it makes vectors, not text. Serve it with"):
        load_served_model(LoadOptions(model=str(minilm_dir()), device="cpu", dtype="fp32"))


def test_a_chat_checkpoint_also_serves_embeddings(tmp_path, small_tokenizer):
    directory = tmp_path / "tiny"
    directory.mkdir()
    save_model_files(directory, tiny_model(small_tokenizer.vocab_size), small_tokenizer, meta={"stage": "test"})
    served = load_served_model(LoadOptions(model=str(directory), device="cpu", dtype="fp32", max_model_len=128,
                                           kv_cache_gb=0.01, compile=False, pooling="last"))
    server = start_server(served)
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)
        reply = client.embeddings.create(model="tiny", input=["To be, or not to be", "that is the question"])
        got = torch.tensor([d.embedding for d in reply.data])
        assert got.shape == (2, 64)
        torch.testing.assert_close(got, served.embedder.embed_texts(["To be, or not to be", "that is the question"]),
                                   atol=1e-6, rtol=0)
        assert served.embedder.pooling.pooling == "last" and served.embedder.prefix == [small_tokenizer.bos_id]
        chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=3)
        assert chat.choices[0].finish_reason in ("stop", "length")  # generation still works beside it
        with pytest.raises(openai.BadRequestError, match="maximum input length is 128 tokens"):
            client.embeddings.create(model="tiny", input=[list(range(1, 200))])
    finally:
        server.stop()


@pytest.mark.slow
def test_portachat_serve_detects_an_embedding_model_and_refuses_flags_that_do_not_apply(tmp_path):
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def serve(*args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "portachat", "serve", "--model", str(minilm_dir()), *args],
                                cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    port = free_port()
    proc = serve("--port", str(port), "--dtype", "fp32", "--served-model-name", "minilm")
    try:
        wait_healthy(f"http://127.0.0.1:{port}", timeout_s=120)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60)
        reply = client.embeddings.create(model="minilm", input=TEXTS[:2])
        assert len(reply.data) == 2 and len(reply.data[0].embedding) == 384
        with pytest.raises(openai.BadRequestError, match="embedding model"):
            client.chat.completions.create(model="minilm", messages=[{"role": "user", "content": "hi"}])
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert "BERT encoder" in err and "serves /v1/embeddings only" in err, err
    proc = serve("--port", str(free_port()), "--quantize", "int8")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "--quantize does not apply to an embedding model" in err, err
    chat = subprocess.run([sys.executable, "-m", "portachat", "chat", "--model", str(minilm_dir())], cwd=repo, env=env,
                          input="", capture_output=True, text=True, timeout=120)
    assert chat.returncode != 0 and "is an embedding model: it makes vectors, not text" in chat.stderr, chat.stderr


def test_concurrent_requests_each_get_their_own_vectors(minilm_server):
    from concurrent.futures import ThreadPoolExecutor

    texts = [f"request number {i} says something {'long ' * i}" for i in range(12)]

    def ask(text: str) -> list[float]:
        body = httpx.post(f"{minilm_server.url}/v1/embeddings", json={"input": text}, timeout=60).json()
        return body["data"][0]["embedding"]

    with ThreadPoolExecutor(8) as pool:
        got = torch.tensor(list(pool.map(ask, texts)))
    torch.testing.assert_close(got, minilm_server.embedder.embed_texts(texts), atol=1e-5, rtol=0)
