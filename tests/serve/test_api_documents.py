"""Document QA on the real server with the openai client: Files and vector-store routes, search,
grounded chat with citations (plain and streamed), errors in OpenAI's shape, and a collection that
is still there after the server restarts. Models: all-MiniLM-L6-v2 for embeddings, a tiny random
chat model beside it in one registry."""

from __future__ import annotations

import io
import json

import docx
import httpx
import openai
import pytest
from api_testing import chat_tokenizer, serve_in_thread, served_tiny, tiny_model

from portachat.engine.loading import LoadOptions, load_served_model
from portachat.serve.api import ServerSettings, create_app
from portachat.serve.registry import ModelRegistry, ModelSpec
from tests.minilm import minilm_dir

DOCS = {
    "volcanoes.txt": ("Volcanoes form where magma rises through the crust. Mount Etna in Sicily is one of the most "
                      "active volcanoes in Europe. Lava from Etna has reached the town of Catania several times."),
    "baking.md": ("# Bread\n\nBread dough needs flour, water, salt and yeast. The yeast ferments sugars and releases "
                  "carbon dioxide, which makes the dough rise. Bake the loaf at 230 degrees for 35 minutes."),
    "tides.html": ("<html><body><h1>Tides</h1><p>Ocean tides are caused mainly by the gravity of the Moon. "
                   "Spring tides happen when the Sun and Moon line up.</p><script>x()</script></body></html>"),
}
QUERIES = {"Which volcano in Europe is very active?": "volcanoes.txt",
           "What makes bread dough rise?": "baking.md",
           "Why does the ocean have tides?": "tides.html",
           "Which animal eats bamboo in Sichuan?": "panda.docx"}


def panda_docx() -> bytes:
    document = docx.Document()
    document.add_paragraph("大熊猫生活在中国四川的山区。它们主要吃竹子。")
    document.add_paragraph("Giant pandas live in the mountains of Sichuan and eat bamboo almost all day.")
    buffer = io.BytesIO()
    document.save(buffer)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def models(small_tokenizer):
    tok = chat_tokenizer(small_tokenizer)
    minilm = load_served_model(LoadOptions(model=str(minilm_dir()), device="cpu", dtype="fp32"), embedding_models=True)
    return {"tiny": lambda: served_tiny(tok, max_model_len=2048, model=tiny_model(tok.vocab_size, max_seq_len=2048)),
            "minilm": lambda: minilm}


def start(models: dict, names: tuple[str, ...] = ("tiny", "minilm"), **settings):
    registry = ModelRegistry([ModelSpec(n, "", pinned=True) for n in names], lambda spec: models[spec.name]())
    return serve_in_thread(create_app(ServerSettings(served_model_name="tiny", **settings), registry=registry))


def client_for(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def wait_ready(server) -> None:
    from api_testing import wait_healthy

    wait_healthy(server.url)


def test_files_vector_stores_search_grounded_chat_and_restart(models, tmp_path):
    server = start(models)
    try:
        wait_ready(server)
        client = client_for(server)
        ids = {}
        for name, text in DOCS.items():
            f = client.files.create(file=(name, text.encode()), purpose="assistants")
            assert f.object == "file" and f.filename == name and f.bytes == len(text.encode())
            ids[name] = f.id
        ids["panda.docx"] = client.files.create(file=("panda.docx", panda_docx()), purpose="assistants").id
        assert {f.id for f in client.files.list()} == set(ids.values())
        assert client.files.retrieve(ids["baking.md"]).filename == "baking.md"

        vs = client.vector_stores.create(name="library")
        assert vs.object == "vector_store" and vs.name == "library"
        for file_id in ids.values():
            attached = client.vector_stores.files.create(vector_store_id=vs.id, file_id=file_id)
            assert attached.status == "completed" and attached.vector_store_id == vs.id and attached.last_error is None
        assert client.vector_stores.retrieve(vs.id).file_counts.completed == 4
        assert {f.id for f in client.vector_stores.files.list(vector_store_id=vs.id)} == set(ids.values())

        firsts = {}
        for query, want in QUERIES.items():
            page = client.vector_stores.search(vector_store_id=vs.id, query=query, max_num_results=3)
            results = list(page)
            assert 1 <= len(results) <= 3 and results[0].score >= results[-1].score
            firsts[query] = (results[0].filename, results[0].content[0].text)
            assert results[0].filename == want, (query, [(r.filename, r.score) for r in results])
            assert results[0].file_id == ids[want] and results[0].attributes["chunk_index"] == 0
            assert results[0].content[0].type == "text" and results[0].content[0].text

        # Grounded chat: the reply lists the passages it was given, best first.
        plain = client.chat.completions.create(model="tiny", max_tokens=4, temperature=0,
                                               messages=[{"role": "user", "content": "What makes bread dough rise?"}])
        grounded = client.chat.completions.create(
            model="tiny", max_tokens=4, temperature=0,
            messages=[{"role": "user", "content": "What makes bread dough rise?"}],
            extra_body={"documents": {"vector_store_ids": [vs.id], "max_num_results": 2}})
        citations = grounded.model_extra["citations"]
        assert [c["index"] for c in citations] == [1, 2] and citations[0]["filename"] == "baking.md"
        assert citations[0]["file_id"] == ids["baking.md"] and "yeast" in citations[0]["text"]
        assert grounded.usage.prompt_tokens > plain.usage.prompt_tokens + 20  # the passages are in the prompt
        assert "citations" not in (plain.model_extra or {})
        streamed = list(client.chat.completions.create(  # the same request streamed: the same citations, once
            model="tiny", max_tokens=4, temperature=0, stream=True,
            messages=[{"role": "user", "content": "What makes bread dough rise?"}],
            extra_body={"documents": {"vector_store_ids": [vs.id], "max_num_results": 2}}))
        assert streamed[0].model_extra["citations"] == citations
        assert all("citations" not in (c.model_extra or {}) for c in streamed[1:])
        # Passages never take more than half a small model's context: the lowest ranked are left out.
        long = " ".join(f"Chapter {i} tells how the baker kneaded the dough for {i} minutes." for i in range(300))
        book = client.files.create(file=("book.txt", long.encode()), purpose="assistants")
        shelf = client.vector_stores.create(name="shelf", file_ids=[book.id])
        many = client.chat.completions.create(
            model="tiny", max_tokens=4, messages=[{"role": "user", "content": "How long was the dough kneaded?"}],
            extra_body={"documents": {"vector_store_ids": [shelf.id], "max_num_results": 50}})
        chunks = client.vector_stores.files.retrieve(file_id=book.id, vector_store_id=shelf.id).attributes["chunks"]
        assert 1 <= len(many.model_extra["citations"]) < chunks and many.usage.prompt_tokens < 2048
        client.vector_stores.delete(shelf.id)

        stream = client.chat.completions.create(
            model="tiny", max_tokens=4, stream=True, messages=[{"role": "user", "content": "Tell me about Etna"}],
            extra_body={"documents": {"vector_store_ids": [vs.id], "max_num_results": 1}})
        chunks = list(stream)
        assert chunks[0].model_extra["citations"][0]["filename"] == "volcanoes.txt"
        assert all("citations" not in (c.model_extra or {}) for c in chunks[1:])

        # Detach and delete.
        client.vector_stores.files.delete(file_id=ids["tides.html"], vector_store_id=vs.id)
        results = list(client.vector_stores.search(vector_store_id=vs.id, query="tides and the Moon", max_num_results=5))
        assert "tides.html" not in {r.filename for r in results}
        assert client.files.delete(ids["tides.html"]).deleted
    finally:
        server.stop()

    # A new server over the same PORTACHAT_HOME sees the same collection and finds the same passages.
    server = start(models)
    try:
        wait_ready(server)
        client = client_for(server)
        assert [v.name for v in client.vector_stores.list()] == ["library"]
        assert client.vector_stores.retrieve(vs.id).file_counts.completed == 3
        for query, (filename, text) in firsts.items():
            if filename == "tides.html":
                continue
            top = next(iter(client.vector_stores.search(vector_store_id=vs.id, query=query, max_num_results=1)))
            assert (top.filename, top.content[0].text) == (filename, text)
        assert client.vector_stores.delete(vs.id).deleted
        assert list(client.vector_stores.list()) == []
    finally:
        server.stop()


def _error(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_errors_in_openai_shape(models):
    server = start(models)
    try:
        wait_ready(server)
        url = server.url + "/v1"
        missing = httpx.post(f"{url}/vector_stores/vs_nope/search", json={"query": "x"}, timeout=30)
        assert missing.status_code == 404 and "vs_nope" in _error(missing)["message"]
        vs = httpx.post(f"{url}/vector_stores", json={"name": "c"}, timeout=30).json()
        nofile = httpx.post(f"{url}/vector_stores/{vs['id']}/files", json={"file_id": "file-nope"}, timeout=30)
        assert nofile.status_code == 404 and "file-nope" in _error(nofile)["message"]
        assert httpx.post(f"{url}/files", files={"file": ("a.txt", b"hi")}, timeout=30).status_code == 400
        image = httpx.post(f"{url}/files", data={"purpose": "assistants"},
                           files={"file": ("a.png", b"\x89PNG\r\n\x1a\n\x00\xff\xfe\x81")}, timeout=30).json()
        failed = httpx.post(f"{url}/vector_stores/{vs['id']}/files", json={"file_id": image["id"]}, timeout=30).json()
        assert failed["status"] == "failed" and failed["last_error"]["code"] == "unsupported_file"
        bad = httpx.post(f"{url}/chat/completions", timeout=30, json={
            "messages": [{"role": "user", "content": "hi"}], "documents": {"vector_store_ids": []}})
        assert bad.status_code == 400 and _error(bad)["param"] == "documents"
        empty = httpx.post(f"{url}/vector_stores/{vs['id']}/search", json={"query": " "}, timeout=30)
        assert empty.status_code == 400 and _error(empty)["param"] == "query"
        # A vector store made with its files at once (OpenAI's file_ids), then searched.
        client = client_for(server)
        f = client.files.create(file=("moon.txt", b"The Moon orbits the Earth every 27 days."), purpose="assistants")
        made = client.vector_stores.create(name="sky", file_ids=[f.id])
        assert made.file_counts.completed == 1 and made.usage_bytes > 0
        top = next(iter(client.vector_stores.search(vector_store_id=made.id, query="How long is the Moon's orbit?")))
        assert top.file_id == f.id and top.filename == "moon.txt"
        with pytest.raises(openai.NotFoundError):
            client.vector_stores.create(name="x", file_ids=["file-nope"])
        assert [v.name for v in client.vector_stores.list()].count("x") == 0  # nothing made for a bad request
    finally:
        server.stop()

    server = start(models, names=("tiny",))  # no embedding model registered
    try:
        wait_ready(server)
        vs = httpx.post(f"{server.url}/v1/vector_stores", json={"name": "c"}, timeout=30).json()
        f = httpx.post(f"{server.url}/v1/files", data={"purpose": "assistants"}, files={"file": ("a.txt", b"hi")},
                       timeout=30).json()
        r = httpx.post(f"{server.url}/v1/vector_stores/{vs['id']}/files", json={"file_id": f["id"]}, timeout=30)
        assert r.status_code == 400 and "--model NAME=PATH" in _error(r)["message"]
        assert json.loads(r.text)["error"]["code"] == "no_embedding_model"
    finally:
        server.stop()


def test_uploads_have_their_own_size_limit(models):
    server = start(models, names=("tiny",), max_body_bytes=2000, max_upload_bytes=50_000)
    try:
        wait_ready(server)
        doc = ("A sentence about limits. " * 1000).encode()  # 25 kB: over the body limit, under the upload limit
        ok = httpx.post(f"{server.url}/v1/files", data={"purpose": "assistants"}, files={"file": ("a.txt", doc)},
                        timeout=30)
        assert ok.status_code == 200 and ok.json()["bytes"] == len(doc)
        big = httpx.post(f"{server.url}/v1/files", data={"purpose": "assistants"},
                         files={"file": ("a.txt", doc * 3)}, timeout=30)
        assert big.status_code == 413 and "--max-upload-bytes" in _error(big)["message"]
        chat = httpx.post(f"{server.url}/v1/chat/completions", timeout=30,
                          json={"messages": [{"role": "user", "content": "x" * 5000}]})
        assert chat.status_code == 413 and "--max-body-bytes" in _error(chat)["message"]
    finally:
        server.stop()


@pytest.mark.slow
def test_sigkill_of_the_server_during_an_attach_leaves_the_file_whole_or_absent(tmp_path):
    """`portachat serve` with only an embedding model: a long attach is cut by SIGKILL; after the restart
    the collection is as before the attach, and the same attach then completes."""
    import os
    import subprocess
    import sys
    import threading
    import time
    from pathlib import Path

    from api_testing import free_port, wait_healthy

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PORTACHAT_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1"}

    def serve(port: int) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "portachat", "serve", "--model", f"minilm={minilm_dir()}",
                                 "--dtype", "fp32", "--port", str(port)], cwd=repo, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    port = free_port()
    proc = serve(port)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", timeout_s=120)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=300)
        small = client.files.create(file=("small.txt", b"Copper conducts electricity well."), purpose="assistants")
        vs = client.vector_stores.create(name="kb", file_ids=[small.id])
        text = " ".join(f"Fact number {i} says that {i} is followed by {i + 1}." for i in range(2000))
        big = client.files.create(file=("big.txt", text.encode()), purpose="assistants")
        outcome: list = []

        def attach() -> None:
            try:
                outcome.append(client.vector_stores.files.create(vector_store_id=vs.id, file_id=big.id))
            except openai.APIConnectionError as exc:
                outcome.append(exc)

        worker = threading.Thread(target=attach)
        worker.start()
        time.sleep(3)  # embedding ~130 chunks on one thread takes longer than this
        assert not outcome, "the attach finished before it could be interrupted"
        proc.kill()
        proc.wait(timeout=30)
        worker.join(timeout=60)
        assert isinstance(outcome[0], openai.APIConnectionError)
    finally:
        proc.kill()
    port = free_port()
    proc = serve(port)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", timeout_s=120)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=300)
        assert [f.id for f in client.vector_stores.files.list(vector_store_id=vs.id)] == [small.id]
        assert client.files.retrieve(big.id).bytes == len(text.encode())  # the upload itself had finished
        done = client.vector_stores.files.create(vector_store_id=vs.id, file_id=big.id)
        assert done.status == "completed" and done.attributes["chunks"] > 64
        top = next(iter(client.vector_stores.search(vector_store_id=vs.id, query="Fact number 1500")))
        assert top.filename == "big.txt" and "Fact number 1500 " in top.content[0].text
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_the_embedding_model_loads_on_demand_and_the_flag_picks_it(models):
    # --models-dir style: minilm registered by path, not loaded until a document needs it.
    registry = ModelRegistry([ModelSpec("tiny", "", pinned=True), ModelSpec("minilm", str(minilm_dir()))],
                             lambda spec: models[spec.name]())
    server = serve_in_thread(create_app(ServerSettings(served_model_name="tiny"), registry=registry))
    try:
        wait_ready(server)
        client = client_for(server)
        status = {m.id: m.model_extra["status"] for m in client.models.list()}
        assert status == {"tiny": "loaded", "minilm": "available"}
        f = client.files.create(file=("a.txt", b"Owls hunt at night."), purpose="assistants")
        vs = client.vector_stores.create(name="birds", file_ids=[f.id])
        assert vs.file_counts.completed == 1
        assert {m.id: m.model_extra["status"] for m in client.models.list()}["minilm"] == "loaded"
    finally:
        server.stop()

    server = start(models, embedding_model="tiny")  # named explicitly, but it makes no embeddings
    try:
        wait_ready(server)
        f = httpx.post(f"{server.url}/v1/files", data={"purpose": "assistants"}, files={"file": ("a.txt", b"hi")},
                       timeout=30).json()
        r = httpx.post(f"{server.url}/v1/vector_stores", json={"name": "x", "file_ids": [f["id"]]}, timeout=30)
        assert r.status_code == 400 and _error(r)["code"] == "model_not_supported"
        names = [v["name"] for v in httpx.get(f"{server.url}/v1/vector_stores", timeout=30).json()["data"]]
        assert names == ["birds"]  # nothing half-made
    finally:
        server.stop()
