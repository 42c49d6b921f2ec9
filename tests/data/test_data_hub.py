"""download_shards against a fake Hub: a tiny HTTP server on 127.0.0.1 speaking the endpoints
huggingface_hub uses (the tree listing API and /{type}s/{repo}/resolve/{rev}/{file})."""

from __future__ import annotations

import hashlib
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from portachat.data.document_source import DataError
from portachat.data.hub import download_shards, local_shards
from portachat.data.sources import open_source

REPO = "someone/tiny-edu"
COMMIT = "a" * 40


def parquet_bytes(texts: list[str], row_group_size: int = 4) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table({"text": texts, "id": list(range(len(texts)))}), buf, row_group_size=row_group_size)
    return buf.getvalue()


class FakeHub:
    """Serves `files` (name -> bytes) of one dataset repo; records the requests it saw."""

    def __init__(self, files: dict[str, bytes]):
        self.files = files
        self.requests: list[tuple[str, str, str | None]] = []
        self.drop_next_body_at: int | None = None  # send only this many bytes of the next file, then hang up
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def _file(self) -> tuple[str, bytes] | None:
                path = unquote(urlparse(self.path).path)
                prefix = f"/datasets/{REPO}/resolve/"
                if not path.startswith(prefix):
                    return None
                name = path[len(prefix):].split("/", 1)[1]
                return (name, hub.files[name]) if name in hub.files else None

            def _file_headers(self, data: bytes) -> None:
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.send_header("Accept-Ranges", "bytes")

            def _json(self, obj) -> None:
                body = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_HEAD(self):
                hub.requests.append(("HEAD", self.path, self.headers.get("Range")))
                found = self._file()
                if found is None:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self._file_headers(found[1])
                self.send_header("Content-Length", str(len(found[1])))
                self.end_headers()

            def do_GET(self):
                hub.requests.append(("GET", self.path, self.headers.get("Range")))
                url = urlparse(self.path)
                if url.path.startswith(f"/api/datasets/{REPO}/revision/"):
                    self._json({"id": REPO, "sha": COMMIT, "private": False,
                                "siblings": [{"rfilename": name} for name in sorted(hub.files)]})
                    return
                if url.path.startswith(f"/api/datasets/{REPO}/tree/"):
                    listing = [
                        {"type": "file", "path": name, "size": len(data),
                         "oid": hashlib.sha1(data).hexdigest()}
                        for name, data in sorted(hub.files.items())
                    ]
                    self._json(listing)
                    return
                if url.path.startswith("/api/datasets/"):  # another repo
                    self.send_response(404)
                    self.send_header("X-Error-Code", "RepoNotFound")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                found = self._file()
                if found is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = found[1]
                start = 0
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes="):
                    start = int(rng[len("bytes="):].split("-")[0])
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                self._file_headers(data)
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                if hub.drop_next_body_at is not None:
                    cut, hub.drop_next_body_at = hub.drop_next_body_at, None
                    self.wfile.write(data[start:cut])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(data[start:])

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hub_files() -> dict[str, bytes]:
    return {
        "data/shard_00000.parquet": parquet_bytes([f"train doc {i} " * 5 for i in range(12)]),
        "data/shard_00001.parquet": parquet_bytes([f"more doc {i} " * 5 for i in range(12)]),
        "data/shard_00002.parquet": parquet_bytes([f"val doc {i} " * 5 for i in range(8)]),
        "README.md": b"# tiny\n",
    }


@pytest.fixture
def online(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))  # never touch the user's cache or token
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")


def test_download_verifies_and_skips_present(online, monkeypatch, tmp_path, hub_files):
    with FakeHub(hub_files) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        lines: list[str] = []
        dest = tmp_path / "shards"
        paths = download_shards(REPO, dest, num_shards=2, log=lines.append)
        assert [p.relative_to(dest).as_posix() for p in paths] == ["data/shard_00000.parquet",
                                                                  "data/shard_00001.parquet"]
        for p in paths:
            assert p.read_bytes() == hub_files[p.relative_to(dest).as_posix()]
        assert len(lines) == 2 and lines[0].startswith("shard 1/2: data/shard_00000.parquet")
        gets = [r for r in hub.requests if r[0] == "GET" and "/resolve/" in r[1]]
        assert len(gets) == 2

        # second call: files are present and match the etag -> no new body downloads
        hub.requests.clear()
        again = download_shards(REPO, dest, num_shards=2, log=lines.append)
        assert again == paths
        assert not [r for r in hub.requests if r[0] == "GET" and "/resolve/" in r[1]]

        # all shards: the last one is the val split when opened
        paths = download_shards(REPO, dest, log=lambda s: None)
        assert len(paths) == 3
        val = open_source(dest, split="val")
        assert all(d.startswith("val doc") for u in range(val.num_units) for d in val.read_unit(u))
        train = open_source(dest, split="train")
        assert sum(len(train.read_unit(u)) for u in range(train.num_units)) == 24


def test_include_last_keeps_the_val_shard_fixed(online, monkeypatch, tmp_path, hub_files):
    with FakeHub(hub_files) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        dest = tmp_path / "shards"
        paths = download_shards(REPO, dest, num_shards=1, include_last=True, log=lambda s: None)
        assert [p.name for p in paths] == ["shard_00000.parquet", "shard_00002.parquet"]
        val = open_source(dest, split="val")
        assert val.read_unit(0)[0].startswith("val doc")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert download_shards(REPO, dest, num_shards=1, include_last=True, log=lambda s: None) == paths


def test_download_resumes_after_dropped_connection(online, monkeypatch, tmp_path, hub_files):
    name = "data/shard_00000.parquet"
    data = hub_files[name]
    with FakeHub(hub_files) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        # small read chunks (the default is 10 MB), so the bytes before the drop reach the file
        monkeypatch.setattr("huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE", 64)
        half = 64 * (len(data) // 128)
        hub.drop_next_body_at = half  # the connection dies halfway through the body
        paths = download_shards(REPO, tmp_path / "shards", num_shards=1, log=lambda s: None)
        assert paths[0].read_bytes() == data
        ranges = [r[2] for r in hub.requests if r[0] == "GET" and "/resolve/" in r[1]]
        assert ranges == [None, f"bytes={half}-"], f"expected a resumed download, saw {ranges}"


def test_corrupt_shard_is_deleted_and_raises(online, monkeypatch, tmp_path, hub_files):
    hub_files["data/shard_00000.parquet"] = b"PAR1 this is not really parquet PAR1"
    with FakeHub(hub_files) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        dest = tmp_path / "shards"
        with pytest.raises(DataError, match="shard_00000.parquet.*not a valid shard"):
            download_shards(REPO, dest, num_shards=1, log=lambda s: None)
        assert not (dest / "data" / "shard_00000.parquet").exists()
        # fetched twice: once, then once more after deleting the corrupt copy
        assert len([r for r in hub.requests if r[0] == "GET" and "/resolve/" in r[1]]) == 2


def test_missing_text_column_is_rejected(online, monkeypatch, tmp_path):
    buf = io.BytesIO()
    pq.write_table(pa.table({"content": ["a", "b"]}), buf)
    with FakeHub({"x.parquet": buf.getvalue()}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        with pytest.raises(DataError, match="no `text` column"):
            download_shards(REPO, tmp_path / "d", log=lambda s: None)


def test_no_matching_files_and_too_many_asked(online, monkeypatch, tmp_path, hub_files):
    with FakeHub(hub_files) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        with pytest.raises(DataError, match="no files matching '\\*.arrow'"):
            download_shards(REPO, tmp_path / "d", pattern="*.arrow", log=lambda s: None)
        with pytest.raises(DataError, match="fewer than the 9 asked for"):
            download_shards(REPO, tmp_path / "d", num_shards=9, log=lambda s: None)


def test_unknown_repo_is_a_clear_error(online, monkeypatch, tmp_path, hub_files):
    with FakeHub(hub_files) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        with pytest.raises(DataError, match="cannot list files of dataset nobody/nothing@main"):
            download_shards("nobody/nothing", tmp_path / "d", log=lambda s: None)


def test_unreachable_hub_uses_local_shards(online, monkeypatch, tmp_path, hub_files):
    with FakeHub({}) as hub:  # start and stop a server to get a port nobody listens on
        dead = hub.url
    monkeypatch.setenv("HF_ENDPOINT", dead)
    dest = tmp_path / "shards"
    with pytest.raises(DataError, match="cannot reach the Hub.*has 0 file"):
        download_shards(REPO, dest, num_shards=1, log=lambda s: None)
    (dest / "data").mkdir(parents=True)
    for name in ("data/shard_00000.parquet", "data/shard_00001.parquet"):
        (dest / name).write_bytes(hub_files[name])
    lines: list[str] = []
    paths = download_shards(REPO, dest, num_shards=2, log=lines.append)
    assert [p.name for p in paths] == ["shard_00000.parquet", "shard_00001.parquet"]
    assert "offline" in lines[0]


def test_offline_env(monkeypatch, tmp_path, hub_files):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # must not be contacted
    dest = tmp_path / "shards"
    with pytest.raises(DataError, match="HF_HUB_OFFLINE.*2 shard\\(s\\) needed.*huggingface.co/datasets/"):
        download_shards(REPO, dest, num_shards=2, log=lambda s: None)
    dest.mkdir()
    (dest / "a.parquet").write_bytes(hub_files["data/shard_00000.parquet"])
    (dest / ".cache").mkdir()
    (dest / ".cache" / "b.parquet").write_bytes(b"partial")  # hidden: ignored
    assert download_shards(REPO, dest, log=lambda s: None) == [dest / "a.parquet"]
    assert local_shards(dest) == [dest / "a.parquet"]
