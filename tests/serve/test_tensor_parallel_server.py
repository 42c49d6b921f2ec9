"""`portachat serve -tp 2` as a real process with its real worker: the openai client streams through it;
a worker killed mid-stream fails the request within seconds, /health turns 503 and the server exits
non-zero; SIGTERM and Ctrl-C stop everything. Each case ends with a process listing: nothing of the
server's is left running."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import openai
import pytest
from api_testing import free_port, wait_healthy
from tp_testing import assert_failed_within, left_running, serve_process, tiny_llama, wait_up, worker_pids

pytestmark = pytest.mark.slow


@pytest.fixture()
def model(tmp_path) -> Path:
    return tiny_llama(tmp_path / "llama-tp")


@pytest.fixture()
def server(model):
    port = free_port()
    proc = serve_process(model, port, PORTACHAT_TP_STEP_TIMEOUT_S="3")  # the tiny model's steps: milliseconds
    url = f"http://127.0.0.1:{port}"
    wait_up(proc, url)
    workers = worker_pids(proc)
    assert len(workers) == 1
    yield proc, url, workers[0]
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_streams_through_the_openai_client(server):
    proc, url, _ = server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
    args = dict(model="llama-tp", prompt="the quick brown fox", max_tokens=12, temperature=0,
                extra_body={"ignore_eos": True})  # fmt: skip
    whole = client.completions.create(**args)
    pieces = [c.choices[0].text for c in client.completions.create(stream=True, **args) if c.choices]
    assert whole.usage.completion_tokens == 12 and "".join(pieces) == whole.choices[0].text


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "hung"])
def test_a_dead_or_hung_worker_fails_the_stream_and_the_server(server, model, sig):
    proc, url, worker = server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
    stream = client.completions.create(model="llama-tp", prompt="the quick", max_tokens=900, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})  # fmt: skip
    chunks = iter(stream)
    next(chunks)  # the stream is running
    os.kill(worker, sig)  # SIGSTOP: the worker hangs; the step watchdog (3 s here) stops the group
    assert_failed_within(chunks, url, killed=time.monotonic())
    assert proc.wait(30) != 0
    assert ("worker rank 1" if sig == signal.SIGKILL else "has not finished in 3 s") in proc.stderr.read()
    assert left_running(str(model)) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_ctrl_c_stop_every_process(server, model, sig):
    proc, url, _ = server
    # Ctrl-C reaches the terminal's whole process group; SIGTERM only the server.
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    # uvicorn re-raises the signal after a clean shutdown, so supervisors see how it ended (Ctrl-C: the
    # CLI's "interrupted", status 130).
    assert proc.returncode in (0, -sig, 130) and "Traceback" not in err, err[-2000:]
    deadline = time.monotonic() + 10
    while left_running(str(model)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left_running(str(model)) == []


def test_smollm2_gguf_replies_as_one_process(tmp_path):
    """SmolLM2-135M-Instruct (9 query heads over 3 kv heads: 2 + 1 per rank) through the openai client,
    streaming and not: -tp 2 gives -tp 1's greedy replies."""
    from tests.smollm2 import smollm2_gguf_path

    gguf = smollm2_gguf_path()
    ports = {tp: free_port() for tp in (1, 2)}
    procs = {tp: serve_process(gguf, port, tp) for tp, port in ports.items()}  # both load at once
    try:
        replies = {}
        for tp, port in ports.items():
            url = f"http://127.0.0.1:{port}"
            try:
                wait_healthy(url, timeout_s=300)
            except TimeoutError:
                procs[tp].kill()
                pytest.fail(f"-tp {tp} did not come up: {procs[tp].communicate()[1][-3000:]}")
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
            args = dict(model=gguf.stem, messages=[{"role": "user", "content": "What is the capital of France?"}],
                        max_tokens=16, temperature=0)  # fmt: skip
            whole = client.chat.completions.create(**args).choices[0].message.content
            streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **args)
                               if c.choices)  # fmt: skip
            replies[tp] = (whole, streamed)
        assert "Paris" in replies[1][0]
        assert replies[2] == replies[1] and replies[1][0] == replies[1][1]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
                proc.wait(60)
    assert left_running(str(gguf)) == []
