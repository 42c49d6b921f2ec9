"""`portachat serve` as a real subprocess: clear failures, and a clean exit on SIGTERM mid-stream."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from api_testing import free_port, tiny_model, wait_healthy

from portachat.model.model_dir import save_model_files

REPO = Path(__file__).resolve().parents[2]


def serve(*args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "portachat", "serve", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_missing_model_exits_1_with_a_clear_message(tmp_path):
    proc = serve("--model", str(tmp_path / "nowhere"), "--port", str(free_port()))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert "no model at" in err and "Traceback" not in err


def test_port_in_use_exits_nonzero(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = serve("--model", str(tmp_path / "nowhere"), "--port", str(port))
        _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "address already in use" in err.lower() or "error while attempting to bind" in err.lower(), err


@pytest.fixture()
def checkpoint(tmp_path, small_tokenizer) -> Path:
    directory = tmp_path / "tiny"
    directory.mkdir()
    save_model_files(directory, tiny_model(small_tokenizer.vocab_size), small_tokenizer, meta={"stage": "test"})
    return directory


@pytest.mark.slow
def test_sigterm_ends_the_stream_cleanly_and_the_server_exits(checkpoint):
    port = free_port()
    proc = serve("--model", str(checkpoint), "--port", str(port), "--dtype", "fp32", "--shutdown-timeout", "1",
                 "--served-model-name", "tiny", "--max-model-len", "256", "--kv-cache-gb", "0.01")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, timeout_s=180)
        body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 240,
                "ignore_eos": True, "stream": True}
        with httpx.Client(timeout=120) as client, client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            next(lines)
            proc.send_signal(signal.SIGTERM)
            data = [line[len("data: "):] for line in lines if line.startswith("data: ")]
        assert data[-1] == "[DONE]"
        finish = [json.loads(d)["choices"][0]["finish_reason"] for d in data[:-1]]
        assert finish[-1] in ("length", "abort") and all(f is None for f in finish[:-1])
        _, err = proc.communicate(timeout=60)
        # uvicorn re-raises the signal after a clean shutdown, so supervisors see how it ended.
        assert proc.returncode in (0, -signal.SIGTERM), err
        assert "Finished server process" in err and "Traceback" not in err
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/health", timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_health_is_503_while_loading_then_200(checkpoint):
    port = free_port()
    proc = serve("--model", str(checkpoint), "--port", str(port), "--dtype", "fp32", "--kv-cache-gb", "0.01")
    url = f"http://127.0.0.1:{port}"
    try:
        statuses = []
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                statuses.append(httpx.get(f"{url}/health", timeout=5).status_code)
            except httpx.TransportError:
                pass
            if statuses and statuses[-1] == 200:
                break
            time.sleep(0.02)
        assert statuses[-1] == 200 and set(statuses) <= {200, 503}
        models = httpx.get(f"{url}/v1/models").json()
        assert models["data"][0]["id"] == "tiny" and models["data"][0]["max_model_len"] > 0
    finally:
        proc.terminate()
        proc.wait(60)


@pytest.mark.slow
def test_models_dir_serves_each_model_by_name_and_swaps_under_max_loaded_models(tmp_path, small_tokenizer):
    import openai

    models = tmp_path / "models"
    for name, seed in (("left", 1), ("right", 2)):
        (models / name).mkdir(parents=True)
        save_model_files(models / name, tiny_model(small_tokenizer.vocab_size, seed=seed), small_tokenizer,
                         meta={"stage": "test"})
    port = free_port()
    proc = serve("--models-dir", str(models), "--max-loaded-models", "1", "--port", str(port), "--dtype", "fp32",
                 "--kv-cache-gb", "0.01", "--max-model-len", "256")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, timeout_s=180)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120)
        listed = {m.id: m.model_extra["status"] for m in client.models.list().data}
        assert listed == {"left": "available", "right": "available"}
        replies = {}
        for name in ("left", "right", "left"):
            out = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=8, temperature=0)
            assert out.model == name
            replies.setdefault(name, out.choices[0].message.content)
            assert replies[name] == out.choices[0].message.content  # reloaded: the same model
            listed = {m.id: m.model_extra["status"] for m in client.models.list().data}
            assert listed[name] == "loaded" and list(listed.values()).count("loaded") == 1
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert "unloaded left: evicted" in err and "Traceback" not in err


def test_serve_without_any_model_says_what_to_give(tmp_path):
    proc = serve("--port", str(free_port()))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "--model PATH" in err and "--models-dir" in err
    (tmp_path / "empty").mkdir()
    proc = serve("--models-dir", str(tmp_path / "empty"), "--port", str(free_port()))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "holds no model" in err
