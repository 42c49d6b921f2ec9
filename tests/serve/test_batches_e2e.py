"""/v1/batches on a real `portachat serve` process with the `openai` client: a 200-line batch with one
bad line fails naming that line; a good one, its server killed mid-run and started again, completes
with every custom_id answered exactly once."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
from api_testing import free_port, tiny_model, wait_healthy

from portachat.model.model_dir import save_model_files

REPO = Path(__file__).resolve().parents[2]
ENDPOINT = "/v1/chat/completions"


def line(i: int) -> dict:
    return {"custom_id": f"row-{i}", "method": "POST", "url": ENDPOINT,
            "body": {"model": "tiny", "messages": [{"role": "user", "content": f"tell me about {i}"}],
                     "max_tokens": 8, "temperature": 0, "ignore_eos": True}}


def serve(model_dir: Path, port: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "portachat", "serve", "--model", f"tiny={model_dir}", "--port",
                             str(port), "--dtype", "fp32", "--kv-cache-gb", "0.01", "--max-model-len", "256"],
                            cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def upload(client: openai.OpenAI, rows: list) -> str:
    data = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows).encode()
    return client.files.create(file=("batch.jsonl", io.BytesIO(data)), purpose="batch").id


def wait_for(client: openai.OpenAI, batch_id: str, done, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if done(batch):
            return batch
        time.sleep(0.05)
    raise AssertionError(f"batch {batch_id}: {batch.status}, {batch.request_counts} after {timeout_s} s")


@pytest.mark.slow
def test_batches_fail_on_a_bad_line_and_complete_across_a_restart(tmp_path, small_tokenizer):
    model_dir = tmp_path / "tiny"
    model_dir.mkdir()
    save_model_files(model_dir, tiny_model(small_tokenizer.vocab_size, seed=3), small_tokenizer, meta={"stage": "test"})
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=60)
    proc = serve(model_dir, port)
    try:
        wait_healthy(url, timeout_s=120)
        bad = [line(i) for i in range(200)]
        bad[136]["body"]["messages"] = "hello"  # line 137: messages must be a list
        failed = wait_for(client, client.batches.create(input_file_id=upload(client, bad), endpoint=ENDPOINT,
                                                        completion_window="24h").id,
                          lambda b: b.status not in ("validating", "in_progress"))
        assert failed.status == "failed" and failed.output_file_id is None
        assert [(e.line, e.param) for e in failed.errors.data] == [(137, "body.messages")]

        batch = client.batches.create(input_file_id=upload(client, [line(i) for i in range(200)]), endpoint=ENDPOINT,
                                      completion_window="24h")
        running = wait_for(client, batch.id, lambda b: b.request_counts.completed >= 10)
        assert running.status == "in_progress" and running.request_counts.completed < 200
        proc.kill()  # a crash, not a graceful stop
        proc.wait()

        proc = serve(model_dir, port)
        wait_healthy(url, timeout_s=120)
        done = wait_for(client, batch.id, lambda b: b.status == "completed")
        assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (200, 200, 0)
        output = [json.loads(raw) for raw in client.files.content(done.output_file_id).text.splitlines()]
        assert sorted(r["custom_id"] for r in output) == sorted(f"row-{i}" for i in range(200))  # each exactly once
        assert all(r["response"]["status_code"] == 200 and
                   r["response"]["body"]["usage"]["completion_tokens"] == 8 for r in output)
    finally:
        proc.kill()
        proc.wait()
