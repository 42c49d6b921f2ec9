"""`portachat generate` (batch JSONL, resumable) and `portachat chat` over a real tiny checkpoint."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

from portachat.engine import SamplingParams
from portachat.engine.loading import LoadOptions, load_served_model
from portachat.model import GPT, GPTConfig
from portachat.model.model_dir import save_model_files
from portachat.serve.api.batch_lines import BatchLine
from portachat.serve.api.local import local_app
from portachat.serve.api.state import ServerSettings
from portachat.serve.batch import BatchInputError, done_ids, read_input, with_flags
from portachat.serve.terminal_chat import ChatSession, chat_loop, handle_command, reply_parts
from tests.e2e.helpers import run_cli
from tests.serve.api_testing import run_batch


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, small_tokenizer) -> Path:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=small_tokenizer.vocab_size, n_layer=1, n_embd=64, n_head=4, n_kv_head=2,
                    head_dim=16, intermediate_size=128, max_seq_len=128)
    model = GPT(cfg)
    with torch.no_grad():  # random everywhere, so replies depend on the prompt
        for p in model.parameters():
            p.normal_(0, 0.5)
    path = tmp_path_factory.mktemp("ckpt") / "step_000001"
    path.mkdir()
    save_model_files(path, model, small_tokenizer, {"stage": "sft", "step": 1})
    return path


@pytest.fixture(scope="module")
def served(checkpoint):
    return load_served_model(LoadOptions(model=str(checkpoint), device="cpu", dtype="fp32", compile=False,
                                         max_num_seqs=4))


def _write_rows(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def test_batch_writes_every_row_and_resumes(tmp_path, served):
    rows = [{"id": f"r{i}", "prompt": f"To be or not {i}"} for i in range(6)]
    rows.append({"id": "chat", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 3})
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write_rows(inp, rows)
    params = SamplingParams(max_tokens=6, temperature=0.0)
    first = run_batch(served, inp, out, params, max_in_flight=3)
    assert (first.total, first.skipped, first.written) == (7, 0, 7)
    records = {r["id"]: r for r in map(json.loads, out.read_text(encoding="utf-8").splitlines())}
    assert set(records) == {r["id"] for r in rows}
    assert records["chat"]["completion_tokens"] <= 3
    assert all(r["finish_reason"] in ("stop", "length") for r in records.values())
    # Greedy rows are what a one-row run gives (batching must not change results).
    solo_in, solo_out = tmp_path / "solo.jsonl", tmp_path / "solo_out.jsonl"
    _write_rows(solo_in, [rows[2]])
    run_batch(served, solo_in, solo_out, params)
    assert json.loads(solo_out.read_text(encoding="utf-8"))["output"] == records["r2"]["output"]

    # A crash mid-write leaves a partial last line: it is cut off and that row is generated again.
    lines = out.read_text(encoding="utf-8").splitlines()
    out.write_text("\n".join(lines[:4]) + "\n" + lines[4][:10], encoding="utf-8")
    assert len(done_ids(out)) == 4
    second = run_batch(served, inp, out, params)
    assert (second.skipped, second.written) == (4, 3)
    again = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert sorted(r["id"] for r in again) == sorted(r["id"] for r in rows)
    assert {r["id"]: r["output"] for r in again} == {k: v["output"] for k, v in records.items()}
    assert not served.engine.has_unfinished()


def test_batch_rows_can_constrain_their_output(tmp_path, served):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9},
                                               "ok": {"type": "boolean"}}, "required": ["n", "ok"],
              "additionalProperties": False}
    rows = [{"id": "json", "prompt": "To be", "response_format": {"type": "json_schema", "json_schema": {
                "name": "x", "schema": schema}}},
            {"id": "choice", "messages": [{"role": "user", "content": "Yes?"}], "guided_choice": ["aye", "nay"]},
            {"id": "free", "prompt": "To be", "max_tokens": 3}]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write_rows(inp, rows)
    run_batch(served, inp, out, SamplingParams(max_tokens=40, temperature=1.0, seed=3))
    records = {r["id"]: r for r in map(json.loads, out.read_text(encoding="utf-8").splitlines())}
    reply = json.loads(records["json"]["output"])
    assert set(reply) <= {"n", "ok"} and 0 <= reply["n"] <= 9 and isinstance(reply["ok"], bool)
    assert records["choice"]["output"] in ("aye", "nay") and records["choice"]["finish_reason"] == "stop"
    assert records["free"]["completion_tokens"] <= 3


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "not valid JSON"),
        ('{"prompt": ""}', "non-empty 'prompt'"),
        ('{"messages": "hi"}', "in.jsonl:2: Invalid value for 'messages'"),
        ('{"prompt": "x", "temperature": -1, "bogus": 1}', "in.jsonl:2: temperature must be a number from 0 to 2"),
        ('{"prompt": "x", "temperature": "hot"}', "in.jsonl:2: Invalid value for 'temperature'"),
        ('{"prompt": "x", "top_k": 2.5}', "in.jsonl:2: Invalid value for 'top_k'"),
        ('{"prompt": "x", "guided_choice": []}', "in.jsonl:2: guided_choice"),
        ('{"prompt": "x", "response_format": {"type": "yaml"}}', "response_format type 'yaml'"),
    ],
)
def test_batch_rejects_bad_rows_before_generating(tmp_path, served, line, message):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text('{"prompt": "fine"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(BatchInputError, match=message):
        run_batch(served, inp, out, SamplingParams(max_tokens=2))
    assert not out.exists() or out.read_text(encoding="utf-8") == ""


def test_a_bad_batch_line_is_refused_naming_every_bad_line_and_nothing_is_written(tmp_path, served):
    good = {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "To be", "max_tokens": 2}}
    lines = [good, {**good, "custom_id": "b", "url": "/v1/moderations"}, {**good, "custom_id": "c"},
             {**good, "custom_id": "a"}, {**good, "custom_id": "d", "body": {"prompt": "x", "stream": True}}]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write_rows(inp, lines)
    with pytest.raises(BatchInputError) as refused:
        run_batch(served, inp, out, SamplingParams(max_tokens=2))
    message = str(refused.value)
    assert [line.split(": ")[0] for line in message.splitlines()] == [f"{inp}:2", f"{inp}:4", f"{inp}:5"]
    assert "'/v1/moderations'" in message and "repeats" in message and "'stream'" in message
    assert not out.exists()


def test_a_row_whose_request_fails_gets_the_routes_error_and_the_rest_run(tmp_path, served):
    """A conversation the chat template refuses, a reply that cannot fit: the same 400 as over HTTP, in
    the row's 'error'; the other rows are answered."""
    rows = [{"id": "template", "messages": [{"role": "assistant", "content": "hi"}]},
            {"id": "long", "prompt": "To be", "max_tokens": 10_000}, {"id": "fine", "prompt": "To be"}]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write_rows(inp, rows)
    summary = run_batch(served, inp, out, SamplingParams(max_tokens=3, temperature=0.0))
    assert (summary.written, summary.failed) == (3, 2)
    records = {r["id"]: r for r in map(json.loads, out.read_text(encoding="utf-8").splitlines())}
    assert "chat template" in records["template"]["error"] and records["template"]["finish_reason"] == "error"
    assert "maximum context length" in records["long"]["error"]
    assert "error" not in records["fine"] and 1 <= records["fine"]["completion_tokens"] <= 3


def test_chat_loop_multi_turn_and_commands(served):
    lines = iter(["/temperature 0", "/max-tokens 4", "Hello", "/temperature -1", "And again?", "/clear", "/quit"])
    out = io.StringIO()
    chat_loop(served.engine, served.tokenizer, SamplingParams(max_tokens=8, temperature=1.0),
              read_line=lambda _prompt: next(lines), out=out)
    text = out.getvalue()
    assert "(temperature 0.0)" in text and "(max tokens 4)" in text
    assert "/temperature needs a number from 0 to 2," in text
    assert text.count("assistant> ") == 2
    assert "(conversation cleared)" in text
    assert not served.engine.has_unfinished()


def test_slash_commands_change_the_session():
    session = ChatSession(params=SamplingParams())
    out = io.StringIO()
    session.messages.append({"role": "user", "content": "hi"})
    assert handle_command("/system be brief", session, out)
    assert session.system == "be brief" and session.messages == []
    assert session.history()[0] == {"role": "system", "content": "be brief"}
    assert not handle_command("/quit", session, out)


def test_reply_parts_rebuild_tool_calls(served):
    tok = served.tokenizer
    t = tok.tool_tokens
    ids = tok.encode("Let me see") + [t.python_start] + tok.encode("2+3") + [t.python_end, t.output_start]
    ids += tok.encode("5") + [t.output_end] + tok.encode("It is 5")
    parts = reply_parts(tok, ids)
    assert [p["type"] for p in parts] == ["text", "python", "python_output", "text"]
    assert parts[1]["text"] == "2+3" and parts[2]["text"] == "5"
    assert reply_parts(tok, tok.encode("plain")) == "plain"


def test_generate_command_takes_an_openai_batch_file(tmp_path, checkpoint, capsys):
    """In process (the slow test below runs the CLI itself): an OpenAI batch file, urls mixed, gets
    OpenAI's output lines; a bad line refuses the file with exit 1, naming the line, nothing written."""
    from portachat.cli import main

    inp, out = tmp_path / "batch.jsonl", tmp_path / "out.jsonl"
    _write_rows(inp, [{"custom_id": "c", "method": "POST", "url": "/v1/completions",
                       "body": {"model": "gpt-4o-mini", "prompt": "Once upon"}},
                      {"custom_id": "m", "method": "POST", "url": "/v1/chat/completions",
                       "body": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}}])
    engine = ["--model", str(checkpoint), "--device", "cpu", "--dtype", "fp32", "--compile", "0", "--max-num-seqs", "4",
              "--kv-cache-gb", "0.05"]
    assert main(["generate", *engine, "--input", str(inp), "--output", str(out), "--max-tokens", "3"]) == 0
    answers = {r["custom_id"]: r["response"] for r in map(json.loads, out.read_text(encoding="utf-8").splitlines())}
    assert {k: r["status_code"] for k, r in answers.items()} == {"c": 200, "m": 200}
    assert answers["c"]["body"]["usage"]["completion_tokens"] <= 3 and answers["m"]["body"]["object"] == "chat.completion"
    assert answers["c"]["body"]["model"] == str(checkpoint)  # runs on --model, whatever a line names
    assert "2 rows written" in capsys.readouterr().err

    bad, bad_out = tmp_path / "bad.jsonl", tmp_path / "bad_out.jsonl"
    bad.write_text(inp.read_text(encoding="utf-8") + '{"custom_id": "x", "method": "GET", "url": "/v1/completions", '
                   '"body": {"prompt": "x"}}\n', encoding="utf-8")
    assert main(["generate", *engine, "--input", str(bad), "--output", str(bad_out)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:3: Only method POST is supported" in err and "loading" not in err  # refused before loading
    assert not bad_out.exists()


@pytest.mark.slow
def test_generate_and_chat_commands(tmp_path, checkpoint):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write_rows(inp, [{"prompt": "Once upon"}, {"id": "b", "messages": [{"role": "user", "content": "Hi"}]}])
    args = ["generate", "--model", str(checkpoint), "--input", str(inp), "--output", str(out), "--max-tokens", "4"]
    proc = run_cli(args, tmp_path / "home", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "2 rows written" in proc.stderr
    assert [json.loads(x)["id"] for x in out.read_text(encoding="utf-8").splitlines()] == ["1", "b"]
    proc = run_cli(args, tmp_path / "home", timeout=300)  # everything done: nothing to do
    assert proc.returncode == 0 and "0 rows written" in proc.stderr and "(2 already done)" in proc.stderr

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"nope": 1}\n', encoding="utf-8")
    proc = run_cli(["generate", "--model", str(checkpoint), "--input", str(bad), "--output", str(tmp_path / "o2.jsonl")],
                   tmp_path / "home", timeout=300)
    assert proc.returncode == 1 and "bad.jsonl:2" in proc.stderr
    assert not (tmp_path / "o2.jsonl").exists() or (tmp_path / "o2.jsonl").read_text() == ""

    proc = run_cli(["chat", "--model", str(checkpoint), "--prompt", "Hello", "--max-tokens", "3", "--temperature", "0"],
                   tmp_path / "home", timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_reply_is_capped_at_the_room_the_context_leaves(served):
    from portachat.serve.terminal_chat import stream_reply

    session = ChatSession(params=SamplingParams(max_tokens=10_000, temperature=0.0, ignore_eos=True))
    session.messages.append({"role": "user", "content": "Hello"})
    _text, ids, reason = stream_reply(served.engine, served.tokenizer, session, io.StringIO())
    prompt = served.tokenizer.render_prompt(session.history())
    assert reason == "length" and len(prompt) + len(ids) == served.engine.max_model_len


def test_rows_override_the_flags_and_unset_rows_keep_them(tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"prompt": "a", "temperature": 0.9, "stop": "x", "model": "elsewhere"}\n'
                   '{"prompt": "b", "temperature": null}\n{"id": 7, "messages": [{"role": "user", "content": "c\u2028d"}]}\n',
                   encoding="utf-8")
    app = local_app(ServerSettings(served_model_name="m"), loader=lambda: None)  # checked before any model loads
    batch = read_input(inp, app)
    assert batch.format == "rows" and [line.custom_id for line in batch.lines] == ["1", "2", "7"]
    assert [line.endpoint for line in batch.lines] == ["/v1/completions", "/v1/completions", "/v1/chat/completions"]
    flags = SamplingParams(max_tokens=7, temperature=0.2, top_k=5)
    first, second, third = (json.loads(with_flags(line, flags)) for line in batch.lines)
    assert third["messages"][0]["content"] == "c\u2028d"  # a raw line separator inside a string splits no line
    assert (first["temperature"], first["stop"], first["top_k"], "model" in first) == (0.9, "x", 5, False)
    assert (second["temperature"], second["top_k"], second["prompt"]) == (0.2, 5, "b")
    embedding = BatchLine(1, "e", b'{"input": "x"}', "/v1/embeddings")
    assert with_flags(embedding, flags) == b'{"input": "x"}'  # embeddings take no sampling fields


@pytest.mark.parametrize("command,temperature,max_tokens", [("chat", "0.6", "512"), ("generate", "0.0", "256")])
def test_sampling_flags_show_the_fallback_and_take_the_one_check(capsys, command, temperature, max_tokens):
    from portachat.cli import main

    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"else {temperature})" in text and f"(default {max_tokens})" in text
    with pytest.raises(SystemExit) as exit_:
        main([command, "--model", "m", "--input", "i", "--output", "o", "--temperature", "3"])
    assert exit_.value.code != 0
    assert "temperature must be a number from 0 to 2, got 3.0" in capsys.readouterr().err
