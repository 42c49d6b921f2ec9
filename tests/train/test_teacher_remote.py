"""A remote teacher: a tiny local HTTP server in vLLM's prompt_logprobs layout, scored by the same model
in-process, gives the same top-k targets; a server speaking another vocabulary is refused."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from portachat.data.chat_loader import rows_to_batch
from portachat.model.load import load_for_inference
from portachat.train.distill_loss import DistillLoss
from portachat.train.teacher import PROBE_TEXT, InProcessTeacher, RemoteTeacher
from portachat.train.trainer import TrainingError
from tests.model.hf_families import make_hf_dir

httpx = pytest.importorskip("httpx")


def serve(model, tokenizer, k_served: int, shift_ids: bool = False):
    """vLLM's /v1/models, /tokenize and /v1/completions with prompt_logprobs, on a free local port."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def _send(self, obj):
            body = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self._send({"object": "list", "data": [{"id": "tiny-teacher", "object": "model"}]})

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/tokenize":
                ids = tokenizer.encode(req["prompt"])
                self._send({"tokens": [i + 1 for i in ids] if shift_ids else ids, "count": len(ids)})
                return
            prompt = req["prompt"]
            with torch.no_grad():
                logprobs = torch.log_softmax(model(torch.tensor([prompt])).float()[0], -1)
            positions = [None]
            for p in range(1, len(prompt)):
                values, ids = logprobs[p - 1].topk(k_served)
                entry = {str(i): {"logprob": v, "rank": r + 1, "decoded_token": "?"}
                         for r, (i, v) in enumerate(zip(ids.tolist(), values.tolist(), strict=True))}
                actual = prompt[p]  # vLLM adds the prompt's own token with its rank
                entry.setdefault(str(actual), {"logprob": logprobs[p - 1, actual].item(), "rank": 999})
                positions.append(entry)
            self._send({"choices": [{"index": 0, "text": "", "prompt_logprobs": positions}]})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("remote") / "teacher"
    make_hf_dir(directory, "llama", seed=5)
    return directory


@pytest.fixture(scope="module")
def tiny(teacher_dir):
    return load_for_inference(teacher_dir, device="cpu", dtype=torch.float32)


def assert_remote_matches_in_process(url: str, tiny, top_k: int, atol: float):
    """The server at `url` as a remote teacher: its name, vocabulary check, and top-k targets equal to the
    in-process teacher's on a fixed batch. Returns (the remote teacher, the batch)."""
    rows = [([1, 5, 9, 40, 77, 120, 3], [0, 0, 0, 1, 1, 1, 1]), ([1, 300, 64, 12, 8], [0, 0, 1, 1, 1])]
    batch = rows_to_batch(rows, 0, 16)
    loss = DistillLoss(top_k=top_k)
    remote = RemoteTeacher(url)
    assert remote.model == "tiny-teacher"
    remote.check_vocabulary(tiny.tokenizer, tiny.model.config.vocab_size, "student")
    theirs = remote.targets(batch, loss)
    ours = InProcessTeacher(tiny.model, "local").targets(batch, loss)
    assert torch.equal(theirs.ids, ours.ids)
    torch.testing.assert_close(theirs.logprobs, ours.logprobs, atol=atol, rtol=0)
    return remote, batch


def test_remote_top_k_targets_match_the_in_process_teacher(tiny):
    server, url = serve(tiny.model, tiny.tokenizer, k_served=6)
    try:
        remote, batch = assert_remote_matches_in_process(url, tiny, top_k=4, atol=1e-5)
        with pytest.raises(TrainingError, match="--top-k K and --temperature 1"):
            remote.targets(batch, DistillLoss(top_k=4, temperature=2.0))
        with pytest.raises(TrainingError, match="fewer than --top-k 8"):
            remote.targets(batch, DistillLoss(top_k=8))
    finally:
        server.shutdown()


def test_a_remote_teacher_of_another_vocabulary_is_refused(tiny):
    server, url = serve(tiny.model, tiny.tokenizer, k_served=4, shift_ids=True)
    try:
        with pytest.raises(TrainingError) as err:
            RemoteTeacher(url).check_vocabulary(tiny.tokenizer, tiny.model.config.vocab_size, "my-student")
        assert url in str(err.value) and "my-student" in str(err.value) and str(tiny.model.config.vocab_size) in str(err.value)
        assert len(tiny.tokenizer.encode(PROBE_TEXT)) > 20
    finally:
        server.shutdown()


def test_an_unreachable_teacher_says_where():
    with pytest.raises(TrainingError, match="127.0.0.1:9"):
        RemoteTeacher("http://127.0.0.1:9", model="m")._post("/tokenize", {})


def start_portachat_serve(model_dir: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "portachat", "serve", "--model", str(model_dir), "--port", str(port),
                             "--dtype", "fp32", "--served-model-name", "tiny-teacher", "--max-model-len", "256",
                             "--kv-cache-gb", "0.01"], cwd=Path(__file__).resolve().parents[2],
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"portachat serve did not come up: {proc.communicate()[1][-2000:]}")


@pytest.mark.slow
def test_a_portachat_server_is_a_remote_teacher_matching_the_in_process_one(tiny, teacher_dir):
    proc, url = start_portachat_serve(teacher_dir)
    try:
        assert_remote_matches_in_process(url, tiny, top_k=5, atol=1e-4)
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
