"""Issue 26, items 2 and 4: document work that stays linear and bounded, and documents that belong to
the API key that made them. Hostile input in, 4xx (or a `failed` file) out, the server healthy after.

Owners: the server's API-key check records who asked (serve/api/owner.py); here `request_owner` is
replaced by the bearer token itself, so key A and key B are two different owners."""

from __future__ import annotations

import io
import re
import time
import zipfile

import docx
import httpx
import pytest
import torch

from portachat.engine.loading import LoadOptions, load_served_model
from portachat.serve.api import ServerSettings, create_app, documents, protocol
from portachat.serve.docs import DocStore, chunk_text
from portachat.serve.docs.ingest import TextEmbedder, attach_file
from portachat.serve.registry import ModelRegistry, ModelSpec
from tests.minilm import minilm_dir
from tests.serve.api_testing import wait_healthy
from tests.serve.threaded_server import serve_in_thread

TEXT = b"The Moon orbits the Earth every 27 days. Tides follow the Moon."


# ------------------------------------------------------------------------------------------ chunking


def test_a_long_text_without_a_full_stop_chunks_in_linear_time():
    words = re.compile(r"\w+|[^\w\s]")
    counted = [0]

    def count(text: str) -> int:  # a word-level tokenizer; counts how much text it was given
        counted[0] += len(text)
        return len(words.findall(text))

    text = " ".join(f"word{i % 997}" for i in range(40_000))[:320_000]  # 320k characters, one "sentence"
    started = time.perf_counter()
    chunks = chunk_text(text, max_tokens=250, overlap_tokens=41, count=count)
    assert time.perf_counter() - started < 5  # was 38 s with a real tokenizer
    assert counted[0] < 10 * len(text)  # each character tokenized a few times, not once per cut (~100x before)
    assert all(c.tokens <= 250 for c in chunks) and chunks[-1].end == len(text)
    assert " ".join(c.text for c in chunks).split() == text.split()


# ------------------------------------------------------------------------------------------ unreadable files


def _docx_with(document_xml: bytes) -> bytes:
    """A real .docx whose word/document.xml is replaced."""
    buffer = io.BytesIO()
    docx.Document().save(buffer)
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as src, zipfile.ZipFile(out, "w") as dst:
        for item in src.infolist():
            dst.writestr(item, document_xml if item.filename == "word/document.xml" else src.read(item))
    return out.getvalue()


def _pdf_with_text(text: str) -> bytes:
    from pypdf import PdfWriter
    from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

    writer = PdfWriter()
    page = writer.add_blank_page(200, 200)
    font = DictionaryObject({NameObject("/Type"): NameObject("/Font"), NameObject("/Subtype"): NameObject("/Type1"),
                             NameObject("/BaseFont"): NameObject("/Helvetica")})
    page[NameObject("/Resources")] = DictionaryObject(
        {NameObject("/Font"): DictionaryObject({NameObject("/F1"): writer._add_object(font)})})
    content = DecodedStreamObject()
    content.set_data(f"BT /F1 12 Tf 10 100 Td ({text}) Tj ET".encode())
    page[NameObject("/Contents")] = writer._add_object(content.flate_encode())
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


class _FakeModel(TextEmbedder):
    def __init__(self) -> None:
        super().__init__("fake", lambda texts: torch.ones(len(texts), 4), lambda text: len(text.split()), 64)


UNREADABLE = {
    "broken-xml.docx": _docx_with(b"<w:document xmlns:w='http://schemas.openxmlformats.org/"
                                  b"wordprocessingml/2006/main'><w:body><w:p>"),  # not well-formed XML
    "not-a-zip.docx": b"PK\x03\x04 this is no zip archive",
    "garbage.pdf": b"%PDF-1.7\n1 0 obj << /Type /Catalog /Pages 9 0 R >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF",
}


@pytest.mark.parametrize("name", sorted(UNREADABLE))
def test_an_unreadable_docx_or_pdf_is_a_failed_file_not_an_error(tmp_path, name):
    store = DocStore(tmp_path)
    vs = store.create_store("c")
    f = store.add_file(name, UNREADABLE[name])
    row = attach_file(store, vs["id"], f["id"], _FakeModel())
    assert row["status"] == "failed" and "invalid_file" in row["last_error"] and name in row["last_error"]


def test_a_pdf_stream_past_pypdfs_flate_limit_is_a_failed_file(tmp_path, monkeypatch):
    import pypdf.filters

    data = _pdf_with_text("Hello from a compressed page " * 20)
    store = DocStore(tmp_path)
    vs = store.create_store("c")
    readable = attach_file(store, vs["id"], store.add_file("ok.pdf", data)["id"], _FakeModel())
    assert readable["status"] == "completed"
    monkeypatch.setattr(pypdf.filters, "ZLIB_MAX_OUTPUT_LENGTH", 64)  # the page's stream is now "a bomb"
    row = attach_file(store, vs["id"], store.add_file("bomb.pdf", data)["id"], _FakeModel())
    assert row["status"] == "failed" and "invalid_file" in row["last_error"]


# ------------------------------------------------------------------------------------------ the server


@pytest.fixture(scope="module")
def minilm():
    return load_served_model(LoadOptions(model=str(minilm_dir()), device="cpu", dtype="fp32"), embedding_models=True)


@pytest.fixture()
def server(minilm, monkeypatch):
    monkeypatch.setattr(documents, "request_owner", lambda request: request.headers.get("authorization", ""))
    servers = []

    def start(**settings):
        registry = ModelRegistry([ModelSpec("minilm", "", pinned=True)], lambda spec: minilm)
        running = serve_in_thread(create_app(ServerSettings(served_model_name="minilm", **settings), registry=registry))
        servers.append(running)
        wait_healthy(running.url)
        return running

    yield start
    for running in servers:
        running.stop()


def _client(url: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=f"{url}/v1", headers={"Authorization": f"Bearer {key}"}, timeout=120)


def _error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    body = r.json()["error"]
    assert set(body) == {"message", "type", "param", "code"}
    return body


def _upload(client: httpx.Client, name: str, data: bytes) -> httpx.Response:
    return client.post("/files", data={"purpose": "assistants"}, files={"file": (name, data)})


def test_one_keys_files_and_vector_stores_are_forbidden_to_another(server):
    running = server()
    a, b = _client(running.url, "key-a"), _client(running.url, "key-b")
    f = _upload(a, "moon.txt", TEXT).json()
    vs = a.post("/vector_stores", json={"name": "sky", "file_ids": [f["id"]]}).json()
    assert vs["file_counts"]["completed"] == 1
    mine = _upload(b, "mine.txt", b"Key B's own notes about rivers.").json()

    assert [x["id"] for x in b.get("/files").json()["data"]] == [mine["id"]]
    assert b.get("/vector_stores").json()["data"] == []
    for r in (b.get(f"/files/{f['id']}"), b.get(f"/files/{f['id']}/content"), b.delete(f"/files/{f['id']}"),
              b.get(f"/vector_stores/{vs['id']}"), b.delete(f"/vector_stores/{vs['id']}"),
              b.get(f"/vector_stores/{vs['id']}/files"), b.get(f"/vector_stores/{vs['id']}/files/{f['id']}"),
              b.delete(f"/vector_stores/{vs['id']}/files/{f['id']}"),
              b.post(f"/vector_stores/{vs['id']}/files", json={"file_id": mine["id"]}),
              b.post(f"/vector_stores/{vs['id']}/search", json={"query": "How long is the Moon's orbit?"}),
              b.post("/vector_stores", json={"name": "theirs", "file_ids": [f["id"]]})):
        assert _error(r, 403)["code"] == "permission_denied"
    assert b.get("/vector_stores").json()["data"] == []  # the refused create made nothing

    assert [x["id"] for x in a.get("/files").json()["data"]] == [f["id"]]  # A still sees all of its own
    assert a.get(f"/files/{f['id']}/content").content == TEXT
    hits = a.post(f"/vector_stores/{vs['id']}/search", json={"query": "How long is the Moon's orbit?"}).json()
    assert hits["data"][0]["file_id"] == f["id"]
    assert a.delete(f"/vector_stores/{vs['id']}").json()["deleted"] is True


def test_id_lists_are_capped_and_deduplicated(server, monkeypatch):
    attached = []

    def counting(*args, **kwargs):
        attached.append(args[2])
        return attach_file(*args, **kwargs)

    monkeypatch.setattr(documents, "attach_file", counting)
    running = server()
    a = _client(running.url, "key-a")
    f = _upload(a, "moon.txt", TEXT).json()
    vs = a.post("/vector_stores", json={"name": "once", "file_ids": [f["id"]] * 100}).json()
    assert vs["file_counts"]["total"] == 1 and attached == [f["id"]]  # chunked and embedded once, not 100 times
    too_many = a.post("/vector_stores", json={"name": "x", "file_ids": [f"file-{i}" for i in range(501)]})
    assert _error(too_many, 400)["param"] == "file_ids"
    with pytest.raises(ValueError, match="at most 16"):  # grounded chat's vector_store_ids (a 400 naming 'documents')
        protocol.Grounding.model_validate({"vector_store_ids": [vs["id"]] * 17})
    assert documents.unique([vs["id"], "vs_b", vs["id"]]) == [vs["id"], "vs_b"]
    assert httpx.get(f"{running.url}/health", timeout=30).status_code == 200


def test_the_storage_quota_answers_400_in_openai_shape(server):
    running = server(docs_max_files=2, docs_max_bytes=4000)
    a = _client(running.url, "key-a")
    first = _upload(a, "a.txt", TEXT).json()
    big = _error(_upload(a, "big.txt", b"x " * 2500), 400)
    assert big["code"] == "storage_quota_exceeded" and "--docs-max-bytes" in big["message"]
    _upload(a, "b.txt", TEXT)
    third = _error(_upload(a, "c.txt", TEXT), 400)
    assert third["code"] == "storage_quota_exceeded" and "--docs-max-files" in third["message"]
    # Chunks and vectors count too: MiniLM's 384 float32s (1.5 kB) per chunk pass the 4000 bytes here.
    long_text = " ".join(f"Sentence {i} about the sea." for i in range(110)).encode()  # 3 kB: several chunks
    a.delete(f"/files/{first['id']}")
    doc = _upload(a, "long.txt", long_text).json()
    full = _error(a.post("/vector_stores", json={"name": "full", "file_ids": [doc["id"]]}), 400)
    assert full["code"] == "storage_quota_exceeded"
    assert a.get("/vector_stores").json()["data"] == []  # no half-made store left behind
    assert httpx.get(f"{running.url}/health", timeout=30).status_code == 200


def test_an_unreadable_upload_is_a_failed_file_over_http(server):
    running = server()
    a = _client(running.url, "key-a")
    vs = a.post("/vector_stores", json={"name": "c"}).json()
    for name, data in UNREADABLE.items():
        f = _upload(a, name, data).json()
        r = a.post(f"/vector_stores/{vs['id']}/files", json={"file_id": f["id"]})
        assert r.status_code == 200 and r.json()["status"] == "failed", r.text
        assert r.json()["last_error"]["code"] == "invalid_file"


def test_the_quota_and_owners_live_in_the_store(tmp_path):
    store = DocStore(tmp_path, max_files=1)
    store.add_file("a.txt", TEXT, owner="A")
    with pytest.raises(LookupError, match="--docs-max-files"):
        store.add_file("b.txt", TEXT, owner="B")
    assert [f["owner"] for f in store.files()] == ["A"] and store.files("B") == []


def test_rows_from_before_owners_belong_to_the_keyless_owner(tmp_path):
    import sqlite3

    (tmp_path / "files").mkdir()
    db = sqlite3.connect(tmp_path / "store.sqlite")  # the schema as it was, without owner columns
    db.execute("CREATE TABLE files (id TEXT PRIMARY KEY, filename TEXT NOT NULL, bytes INTEGER NOT NULL, "
               "created_at INTEGER NOT NULL, purpose TEXT NOT NULL)")
    db.execute("INSERT INTO files VALUES ('file-old', 'old.txt', 3, 0, 'assistants')")
    db.commit()
    db.close()
    store = DocStore(tmp_path)
    assert store.file("file-old")["owner"] == "" and [f["id"] for f in store.files("")] == ["file-old"]
    assert store.files("key-a") == []
