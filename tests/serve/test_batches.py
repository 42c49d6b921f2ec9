"""/v1/batches over /v1/files on a real in-process server (a tiny random model, the `openai` client):
validation that fails a batch naming its lines, the status lifecycle and request_counts, output and
error files in OpenAI's shapes, cancel, listing, ownership per API key, and a job that resumes from
its output file without answering a custom_id twice."""

from __future__ import annotations

import io
import json
import signal
import time

import httpx
import openai
import pytest
from api_testing import chat_tokenizer, run_batch, serve_in_thread, served_tiny

from portachat.engine import SamplingParams
from portachat.engine.loading import LoadOptions, load_served_model
from portachat.serve.api import ServerSettings, create_app
from portachat.serve.api.batch_lines import output_record
from portachat.serve.api.batch_store import BatchJob, BatchStore
from portachat.serve.registry import ModelRegistry, ModelSpec
from tests.minilm import minilm_dir

ENDPOINT = "/v1/chat/completions"


def chat_line(i: int, **body) -> dict:
    return {"custom_id": f"req-{i}", "method": "POST", "url": ENDPOINT,
            "body": {"model": "tiny", "messages": [{"role": "user", "content": f"count to {i}"}], "max_tokens": 3,
                     "temperature": 0, **body}}


def jsonl(rows: list) -> bytes:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows).encode()


@pytest.fixture(scope="module")
def tokenizer(small_tokenizer):
    return chat_tokenizer(small_tokenizer)


def start(tokenizer, **settings):
    registry = ModelRegistry([ModelSpec("tiny", "", pinned=True)], lambda spec: served_tiny(tokenizer))
    return serve_in_thread(create_app(ServerSettings(served_model_name="tiny", **settings), registry=registry))


def client_for(server, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=60)


def upload(client: openai.OpenAI, rows: list, purpose: str = "batch") -> str:
    return client.files.create(file=("input.jsonl", io.BytesIO(jsonl(rows))), purpose=purpose).id


def wait_done(client: openai.OpenAI, batch_id: str, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled", "expired"):
            return batch
        time.sleep(0.05)
    raise AssertionError(f"batch {batch_id} still {batch.status} after {timeout_s} s")


def lines_of(client: openai.OpenAI, file_id: str) -> list[dict]:
    return [json.loads(raw) for raw in client.files.content(file_id).text.splitlines()]


def test_a_batch_runs_every_line_once_in_openai_shapes(tokenizer):
    server = start(tokenizer)
    try:
        client = client_for(server)
        rows = [chat_line(i) for i in range(6)]
        rows[4]["body"]["max_tokens"] = 10_000  # runs, and answers 400 like the same request over HTTP would
        batch = client.batches.create(input_file_id=upload(client, rows), endpoint=ENDPOINT, completion_window="24h",
                                      metadata={"job": "nightly"})
        assert batch.status == "validating" and batch.object == "batch" and batch.metadata == {"job": "nightly"}
        done = wait_done(client, batch.id)
        assert done.status == "completed" and done.errors is None
        assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (6, 5, 1)
        assert done.in_progress_at and done.finalizing_at and done.completed_at and done.expires_at
        output = lines_of(client, done.output_file_id)
        assert sorted(r["custom_id"] for r in output) == ["req-0", "req-1", "req-2", "req-3", "req-5"]
        direct = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "count to 2"}],
                                                max_tokens=3, temperature=0)
        line = next(r for r in output if r["custom_id"] == "req-2")
        assert line["id"].startswith("batch_req_") and line["error"] is None
        assert line["response"]["status_code"] == 200 and line["response"]["body"]["object"] == "chat.completion"
        assert line["response"]["body"]["choices"][0]["message"]["content"] == direct.choices[0].message.content
        (failed,) = lines_of(client, done.error_file_id)
        assert failed["custom_id"] == "req-4" and failed["response"]["status_code"] == 400
        assert failed["response"]["body"]["error"]["code"] == "context_length_exceeded"
        assert client.files.retrieve(done.output_file_id).purpose == "batch_output"
        listed = client.batches.list(limit=10)
        assert [b.id for b in listed.data] == [batch.id]
    finally:
        server.stop()


def test_a_bad_line_fails_the_batch_naming_its_line_and_runs_nothing(tokenizer):
    server = start(tokenizer)
    try:
        client = client_for(server)
        rows: list = [chat_line(i) for i in range(12)]
        rows[1]["body"]["temperature"] = 5  # ranges and constraints are checked up front too
        rows[2]["body"]["guided_choice"] = []
        rows[3] = "{not json"
        rows[6]["body"]["temperature"] = "hot"
        rows[8]["url"] = "/v1/embeddings"
        rows[10]["custom_id"] = "req-0"
        rows[11]["body"]["model"] = "nobody"
        done = wait_done(client, client.batches.create(input_file_id=upload(client, rows), endpoint=ENDPOINT,
                                                       completion_window="24h").id)
        assert done.status == "failed" and done.failed_at and done.output_file_id is None
        assert done.request_counts.total == done.request_counts.completed == 0
        errors = {e.line: e for e in done.errors.data}
        assert sorted(errors) == [2, 3, 4, 7, 9, 11, 12]  # 1-based lines of the file
        assert errors[2].param == "body.temperature" and "from 0 to 2" in errors[2].message
        assert errors[3].param.startswith("body.guided_choice")
        assert errors[4].code == "invalid_json_line" and errors[9].code == "mismatched_endpoint"
        assert errors[7].param == "body.temperature" and errors[11].code == "duplicate_custom_id"
        assert errors[12].code == "model_not_found"
        with pytest.raises(openai.BadRequestError, match="purpose"):  # not a batch file
            client.batches.create(input_file_id=upload(client, [chat_line(0)], purpose="assistants"),
                                  endpoint=ENDPOINT, completion_window="24h")
        with pytest.raises(openai.BadRequestError, match="endpoint"):
            client.batches.create(input_file_id=upload(client, [chat_line(0)]), endpoint="/v1/moderations",
                                  completion_window="24h")
        with pytest.raises(openai.NotFoundError):
            client.batches.retrieve("batch_nope")
    finally:
        server.stop()


def test_cancel_keeps_the_answers_so_far_and_others_keys_see_nothing(tokenizer):
    server = start(tokenizer, api_keys=["alice", "bob"])
    try:
        alice, bob = client_for(server, "alice"), client_for(server, "bob")
        rows = [chat_line(i, max_tokens=40) for i in range(40)]
        batch = alice.batches.create(input_file_id=upload(alice, rows), endpoint=ENDPOINT, completion_window="24h")
        with pytest.raises(openai.PermissionDeniedError):
            bob.batches.retrieve(batch.id)
        assert bob.batches.list().data == []
        while alice.batches.retrieve(batch.id).status == "validating":
            time.sleep(0.02)
        cancelling = alice.batches.cancel(batch.id)
        assert cancelling.status == "cancelling"
        done = wait_done(alice, batch.id)
        assert done.status == "cancelled" and done.cancelled_at and done.cancelling_at
        assert done.request_counts.completed < 40
        if done.request_counts.completed:
            assert len(lines_of(alice, done.output_file_id)) == done.request_counts.completed
        with pytest.raises(openai.ConflictError):
            alice.batches.cancel(batch.id)
    finally:
        server.stop()


def test_a_job_resumes_from_its_output_without_answering_an_id_twice(tokenizer, tmp_path):
    """A job the last server left in_progress with 3 of 8 lines written (the 4th cut off mid-write)."""
    store = BatchStore()
    rows = [chat_line(i) for i in range(8)]
    job = BatchJob(id="batch_resume", owner="", admin=True, endpoint=ENDPOINT, input_file_id="file-gone",
                   completion_window="24h", created_at=int(time.time()), total=8)
    job.stamp("in_progress")
    store.create(job, jsonl(rows))
    earlier = [output_record(f"req-{i}", 200, {"earlier": True}) for i in (0, 3, 5)]
    store.output_path(job.id).write_bytes(jsonl(earlier) + b'{"id": "batch_req_x", "custom_id": "req-6", "resp')
    server = start(tokenizer)
    try:
        client = client_for(server)
        done = wait_done(client, job.id)
        assert done.status == "completed" and done.request_counts.completed == 8
        output = lines_of(client, done.output_file_id)
        ids = [r["custom_id"] for r in output]
        assert sorted(ids) == sorted(f"req-{i}" for i in range(8))  # each once; req-6 ran again
        assert [r for r in output if r["response"]["body"].get("earlier")] == earlier
    finally:
        server.stop()
    assert json.loads((store.directory(job.id) / "batch.json").read_text())["status"] == "completed"


def test_batch_lines_wait_behind_interactive_requests(tokenizer):
    server = start(tokenizer)
    try:
        client = client_for(server)
        rows = [chat_line(i, max_tokens=60) for i in range(30)]
        batch = client.batches.create(input_file_id=upload(client, rows), endpoint=ENDPOINT, completion_window="24h")
        while client.batches.retrieve(batch.id).status != "in_progress":
            time.sleep(0.02)
        reply = httpx.post(f"{server.url}/v1/chat/completions", timeout=30, json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert reply.status_code == 200
        assert client.batches.retrieve(batch.id).status == "in_progress"  # served while the batch ran
    finally:
        server.stop()


def test_a_graceful_stop_mid_batch_leaves_it_to_resume_with_each_id_once(tokenizer):
    server = start(tokenizer)
    client = client_for(server)
    rows = [chat_line(i, max_tokens=8) for i in range(24)]
    batch = client.batches.create(input_file_id=upload(client, rows), endpoint=ENDPOINT, completion_window="24h")
    while client.batches.retrieve(batch.id).request_counts.completed < 3:
        time.sleep(0.01)
    server.server.handle_exit(signal.SIGTERM, None)  # as `kill -TERM`: the lines running end without an answer
    server.thread.join(30)
    store = BatchStore()
    assert json.loads((store.directory(batch.id) / "batch.json").read_text())["status"] == "in_progress"
    written = [json.loads(raw)["custom_id"] for raw in store.output_path(batch.id).read_text().splitlines()]
    assert 3 <= len(written) < 24 and len(set(written)) == len(written)
    assert not store.errors_path(batch.id).exists() or not store.errors_path(batch.id).read_text()

    server = start(tokenizer)
    try:
        client = client_for(server)
        done = wait_done(client, batch.id)
        assert done.status == "completed" and done.request_counts.completed == 24 and done.request_counts.failed == 0
        ids = [r["custom_id"] for r in lines_of(client, done.output_file_id)]
        assert sorted(ids) == sorted(r["custom_id"] for r in rows) and set(written) <= set(ids)
    finally:
        server.stop()


def test_completions_and_embeddings_batches(tokenizer, tmp_path):
    minilm = load_served_model(LoadOptions(model=str(minilm_dir()), device="cpu", dtype="fp32"), embedding_models=True)
    models = {"tiny": lambda: served_tiny(tokenizer), "minilm": lambda: minilm}
    registry = ModelRegistry([ModelSpec(n, "", pinned=True) for n in models], lambda spec: models[spec.name]())
    server = serve_in_thread(create_app(ServerSettings(served_model_name="tiny"), registry=registry))
    try:
        client = client_for(server)
        texts = ["the king", "a queen"]
        rows = [{"custom_id": t, "method": "POST", "url": "/v1/embeddings", "body": {"model": "minilm", "input": t}}
                for t in texts]
        done = wait_done(client, client.batches.create(input_file_id=upload(client, rows), endpoint="/v1/embeddings",
                                                       completion_window="24h").id)
        assert done.status == "completed" and done.request_counts.completed == 2
        direct = client.embeddings.create(model="minilm", input="a queen").data[0].embedding
        got = {r["custom_id"]: r["response"]["body"] for r in lines_of(client, done.output_file_id)}
        assert got["a queen"]["object"] == "list" and got["a queen"]["data"][0]["embedding"] == pytest.approx(direct)

        rows = [{"custom_id": "c", "method": "POST", "url": "/v1/completions",
                 "body": {"model": "tiny", "prompt": "the king", "max_tokens": 4, "temperature": 0}},
                {"custom_id": "s", "method": "POST", "url": "/v1/completions",
                 "body": {"model": "tiny", "prompt": "x", "stream": True}}]
        failed = wait_done(client, client.batches.create(input_file_id=upload(client, rows), endpoint="/v1/completions",
                                                         completion_window="24h").id)
        assert failed.status == "failed" and [(e.line, e.param) for e in failed.errors.data] == [(2, "body.stream")]
        done = wait_done(client, client.batches.create(input_file_id=upload(client, rows[:1]),
                                                       endpoint="/v1/completions", completion_window="24h").id)
        (line,) = lines_of(client, done.output_file_id)
        direct = client.completions.create(model="tiny", prompt="the king", max_tokens=4, temperature=0)
        assert line["response"]["body"]["choices"][0]["text"] == direct.choices[0].text
    finally:
        server.stop()
    inp, out = tmp_path / "embed.jsonl", tmp_path / "out.jsonl"  # the same embedding lines through `generate`
    inp.write_bytes(jsonl([{"custom_id": t, "method": "POST", "url": "/v1/embeddings", "body": {"model": "minilm",
                                                                                                "input": t}}
                           for t in texts]))
    run_batch(minilm, inp, out, SamplingParams())
    local = {r["custom_id"]: r["response"]["body"] for r in map(json.loads, out.read_text().splitlines())}
    assert local["a queen"]["data"][0]["embedding"] == pytest.approx(got["a queen"]["data"][0]["embedding"])


def test_a_job_past_its_window_expires_keeping_the_answers_it_has(tokenizer):
    """A job the server was down for more than 24 hours: the lines not run are not started."""
    store = BatchStore()
    job = BatchJob(id="batch_old", owner="", admin=True, endpoint=ENDPOINT, input_file_id="file-gone",
                   completion_window="24h", created_at=int(time.time()) - 25 * 3600, total=4)
    job.stamp("in_progress")
    store.create(job, jsonl([chat_line(i) for i in range(4)]))
    store.output_path(job.id).write_bytes(jsonl([output_record("req-1", 200, {"earlier": True})]))
    server = start(tokenizer)
    try:
        client = client_for(server)
        done = wait_done(client, job.id)
        assert done.status == "expired" and done.expired_at and done.completed_at is None
        assert (done.request_counts.total, done.request_counts.completed) == (4, 1)
        assert [r["custom_id"] for r in lines_of(client, done.output_file_id)] == ["req-1"]
    finally:
        server.stop()


def test_portachat_generate_answers_a_batch_file_as_v1_batches_does(tokenizer, tmp_path):
    """One file of batch lines, through /v1/batches and through `portachat generate`'s runner on the same
    tiny model: every line's status and greedy content agree (one code path: batch_lines.run_line)."""
    rows = [chat_line(i, max_tokens=4) for i in range(5)]
    rows[2]["body"]["max_tokens"] = 10_000  # a 400 on both sides
    rows[3]["body"].update(stop=["e"], max_tokens=6)
    server = start(tokenizer)
    try:
        client = client_for(server)
        done = wait_done(client, client.batches.create(input_file_id=upload(client, rows), endpoint=ENDPOINT,
                                                       completion_window="24h").id)
        served_lines = lines_of(client, done.output_file_id) + lines_of(client, done.error_file_id)
    finally:
        server.stop()
    inp, out = tmp_path / "batch.jsonl", tmp_path / "out.jsonl"
    inp.write_bytes(jsonl(rows))
    summary = run_batch(served_tiny(tokenizer), inp, out, SamplingParams(max_tokens=99))
    assert (summary.written, summary.failed) == (5, 1)
    generated = [json.loads(raw) for raw in out.read_text(encoding="utf-8").splitlines()]

    def answers(lines: list[dict]) -> dict[str, tuple[int, str]]:
        out = {}
        for line in lines:
            response = line["response"]
            body = response["body"]
            what = body["choices"][0]["message"]["content"] if "choices" in body else body["error"]["code"]
            out[line["custom_id"]] = (response["status_code"], what)
        return out

    assert answers(generated) == answers(served_lines)
    assert answers(generated)["req-2"] == (400, "context_length_exceeded")
    assert len({content for status, content in answers(generated).values() if status == 200}) > 1  # prompts matter
    assert all(line["id"].startswith("batch_req_") and line["error"] is None for line in generated)
