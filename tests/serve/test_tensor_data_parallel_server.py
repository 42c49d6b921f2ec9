"""`portachat serve -tp 2 -dp 2` as a real process: two replicas, each split over two ranks (the server
is rank 0 of both, with one worker each: 4 shards over gloo). Concurrent greedy requests through the
openai client get -tp 1 -dp 1's replies, /metrics counts each request once, and a worker killed
mid-stream fails the requests, /health and the server, leaving no process behind."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import psutil
import pytest
from api_testing import free_port, metric, wait_idle
from tp_testing import assert_failed_within, left_running, serve_process, tiny_llama, wait_up, worker_pids

pytestmark = pytest.mark.slow
PROMPTS = [f"the king {i} said" for i in range(6)]


def _replies(url: str) -> list[str]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)

    def one(prompt: str) -> str:
        return client.completions.create(model="llama-tp", prompt=prompt, max_tokens=8, temperature=0,
                                         extra_body={"ignore_eos": True}).choices[0].text  # fmt: skip

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        return list(pool.map(one, PROMPTS))


def _stream(url: str, prompt: str):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
    chunks = iter(client.completions.create(model="llama-tp", prompt=prompt, max_tokens=900, temperature=0,
                                            stream=True, extra_body={"ignore_eos": True}))  # fmt: skip
    next(chunks)  # running
    return chunks


def test_two_split_replicas_serve_as_one_engine_and_fail_as_one(tmp_path):
    model = tiny_llama(tmp_path / "llama-tp")
    ports = {size: free_port() for size in (1, 2)}
    procs = {size: serve_process(model, port, tp=size, dp=size, PORTACHAT_TP_STEP_TIMEOUT_S="3")
             for size, port in ports.items()}  # fmt: skip
    urls = {size: f"http://127.0.0.1:{port}" for size, port in ports.items()}
    try:
        for size in (1, 2):
            wait_up(procs[size], urls[size])
        expected = _replies(urls[1])
        assert all(expected) and len(set(expected)) > 1  # replies that vary with the prompt
        procs[1].terminate()
        url, proc = urls[2], procs[2]
        workers = {psutil.Process(pid).environ()["RANK"]: pid for pid in worker_pids(proc)}
        assert sorted(workers) == ["1", "2"]  # one worker per replica: world of 1 + 2 * (2 - 1) ranks

        assert _replies(url) == expected
        assert _replies(url) == expected
        wait_idle(url)
        assert metric(url, "portachat:request_success_total") == 2 * len(PROMPTS)  # each request once

        streams = [_stream(url, "the quick"), _stream(url, "a slow")]  # one per replica
        os.kill(workers["2"], signal.SIGKILL)  # replica 1's worker: replica 0 must stop with it
        killed = time.monotonic()
        for chunks in streams:
            assert_failed_within(chunks, url, killed)
        assert proc.wait(30) != 0
        assert "worker rank 1 of replica 1" in proc.stderr.read()
        procs[1].wait(30)
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert left_running(str(model)) == []
