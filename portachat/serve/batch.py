"""Batch inference over a JSONL file: `portachat generate --input in.jsonl --output out.jsonl`.

The input is one of two formats, told apart by its first line:

- OpenAI's batch input, what POST /v1/batches takes: `{"custom_id", "method": "POST", "url", "body"}`
  with url /v1/chat/completions, /v1/completions or /v1/embeddings (a file may mix them). Each line's
  answer is written in OpenAI's output shape, `{"id", "custom_id", "response": {"status_code",
  "request_id", "body"}, "error"}`, errors included (their status_code says so).
- generate's own rows: `{"prompt": TEXT}` (a /v1/completions request) or `{"messages": [...]}` (a
  /v1/chat/completions request), with an optional `id` and any other field of that request
  (max_tokens, temperature, stop, response_format, ...). Output: `{id, output, finish_reason,
  prompt_tokens, completion_tokens}`, plus `error` when the request failed.

Either way it is the /v1/batches code path: every line is checked before anything runs by the
checks a batch's lines get (api/batch_lines.read_lines; a bad line refuses the file, naming each
bad line), then each runs through the route handler an HTTP request of its endpoint would
(batch_lines.run_line), in this process (api/local.py). A line's "model" is not used: every line
runs on the model the command loaded. The command's sampling flags stand for the fields a line
leaves unset; --max-tokens bounds a reply whose line sets no max_tokens (capped at the room the
context leaves).

The output is written one line at a time (append + flush + fsync), so an interrupted run keeps
every finished line; running the same command again skips the ids already in the output and
repairs a last line cut short by a crash (serve/jsonl_rows.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from portachat.engine.served import ServedModel
from portachat.engine.types import SamplingParams
from portachat.i18n import _
from portachat.serve.api.batch_lines import BatchLine, output_record, read_lines, run_line
from portachat.serve.api.local import LOCAL_OWNER, LocalApp, running
from portachat.serve.jsonl_rows import BatchInputError, RowWriter, done_ids

OPENAI_LINES, ROWS = "openai", "rows"
CHAT, COMPLETIONS, EMBEDDINGS = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
FLAG_FIELDS = ("temperature", "top_p", "top_k", "seed")  # what the flags fill where a line leaves it unset
BATCH_KEYS = ("custom_id", "url", "body")  # a line with any of these is an OpenAI batch line

Progress = Callable[[int, int, int, float], None]  # (done, total, completion tokens, seconds)


@dataclass
class BatchInput:
    format: str  # OPENAI_LINES or ROWS
    lines: list[BatchLine]

    @property
    def key(self) -> str:
        """The output's field naming a line (resume skips the lines already there)."""
        return "custom_id" if self.format == OPENAI_LINES else "id"

    @property
    def embeds(self) -> bool:
        return any(line.endpoint == EMBEDDINGS for line in self.lines)


@dataclass
class BatchSummary:
    total: int
    skipped: int  # already in the output from an earlier run
    written: int
    failed: int  # written with an error status (a context overflow, a template that refused the messages, ...)
    completion_tokens: int
    seconds: float


def input_format(data: bytes) -> str:
    """OPENAI_LINES when the first non-blank line is a JSON object with custom_id, url or body; else ROWS
    (a first line that is not JSON is reported by the checks)."""
    for raw in data.split(b"\n"):
        if raw.strip():
            try:
                first = json.loads(raw)
            except (ValueError, RecursionError):
                return ROWS
            return OPENAI_LINES if isinstance(first, dict) and any(k in first for k in BATCH_KEYS) else ROWS
    return ROWS


def row_request(n: int, obj: Any) -> Any:
    """generate's row -> the request line it stands for: a prompt is a completion, messages a chat."""
    if not isinstance(obj, dict):
        return obj  # the line check says what is wrong
    if "messages" in obj:
        url = CHAT
    elif isinstance(obj.get("prompt"), str) and obj["prompt"]:
        url = COMPLETIONS
    else:
        reason = _("each row needs a non-empty 'prompt' string or a 'messages' list (or the file holds OpenAI "
                   "batch lines: custom_id, method, url, body)")
        raise BatchInputError(reason, line=n, reason=reason)
    body = {k: v for k, v in obj.items() if k != "id"}
    return {"custom_id": str(obj.get("id", n)), "method": "POST", "url": url, "body": body}


def _local_request(fmt: str) -> Callable[[int, Any], Any]:
    def to_request(n: int, obj: Any) -> Any:
        if fmt == ROWS:
            obj = row_request(n, obj)
        if isinstance(obj, dict) and isinstance(obj.get("body"), dict) and "model" in obj["body"]:
            obj = {**obj, "body": {k: v for k, v in obj["body"].items() if k != "model"}}  # runs on --model
        return obj

    return to_request


def read_input(path: Path, app: LocalApp) -> BatchInput:
    """Every line checked before anything runs (a bad line 9000 should not cost an hour of
    generation first); BatchInputError naming each bad line (`path:line: what`)."""
    data = path.read_bytes()
    if not data.strip():
        raise BatchInputError(_("{path} has no rows: expected one JSON object per line, {{\"prompt\": ...}} or "
                                "{{\"messages\": [...]}}, or OpenAI batch lines {{\"custom_id\", \"method\", \"url\", "
                                "\"body\"}}").format(path=path))
    fmt = input_format(data)
    lines, errors = read_lines(data, None, app.server, where=str(path), to_request=_local_request(fmt),
                               max_lines=None)
    if errors:
        located = [_("{where}: {error}").format(where=f"{path}:{e['line']}" if e["line"] else str(path),
                                                 error=e["message"]) for e in errors]
        raise BatchInputError("\n".join(located), line=errors[0]["line"])
    return BatchInput(fmt, lines)


def with_flags(line: BatchLine, defaults: SamplingParams) -> bytes:
    """The line's body with the command's sampling values in the fields it leaves unset (None = unset)."""
    if line.endpoint == EMBEDDINGS:
        return line.body
    body = json.loads(line.body)
    for name in FLAG_FIELDS:
        value = getattr(defaults, name)
        if body.get(name) is None and value is not None:
            body[name] = value
    return json.dumps(body, ensure_ascii=False).encode()


def row_record(line: BatchLine, status: int, body: Any) -> dict[str, Any]:
    """A row's answer in generate's own output shape (the first choice)."""
    record: dict[str, Any] = {"id": line.custom_id, "output": "", "finish_reason": "error", "prompt_tokens": 0,
                              "completion_tokens": 0}
    if not 200 <= status < 300:
        error = body.get("error") if isinstance(body, dict) else None
        record["error"] = error.get("message") if isinstance(error, dict) else str(body)
        return record
    choice, usage = body["choices"][0], body["usage"]
    message = choice.get("message") or {}
    record.update(output=choice["text"] if "text" in choice else message.get("content") or "",
                  finish_reason=choice["finish_reason"], prompt_tokens=usage["prompt_tokens"],
                  completion_tokens=usage["completion_tokens"])
    for name in ("reasoning_content", "tool_calls"):  # a thinking model's reasoning, parsed tool calls
        if message.get(name):
            record[name] = message[name]
    return record


async def run_lines(app: LocalApp, batch: BatchInput, output_path: Path, defaults: SamplingParams,
                    max_in_flight: int = 64, progress: Progress | None = None) -> BatchSummary:
    """Run every line not yet in `output_path` through its route (the model running: api/local.running)."""
    done = done_ids(output_path, batch.key)
    todo = [line for line in batch.lines if line.custom_id not in done]
    skipped = len(batch.lines) - len(todo)
    summary = BatchSummary(len(batch.lines), skipped, 0, 0, 0, 0.0)
    slots = asyncio.Semaphore(max_in_flight)
    writer = RowWriter(output_path)
    t0 = time.perf_counter()

    async def one(line: BatchLine) -> None:
        async with slots:
            status, body = await run_line(app, line.endpoint, LOCAL_OWNER, True, with_flags(line, defaults))
        ok = 200 <= status < 300
        writer.write(output_record(line.custom_id, status, body) if batch.format == OPENAI_LINES
                     else row_record(line, status, body))
        summary.written += 1
        summary.failed += not ok
        usage = body.get("usage") if ok and isinstance(body, dict) else None
        summary.completion_tokens += (usage or {}).get("completion_tokens", 0)
        if progress is not None:
            progress(skipped + summary.written, summary.total, summary.completion_tokens, time.perf_counter() - t0)

    try:
        await asyncio.gather(*(one(line) for line in todo))
    finally:
        writer.close()
        summary.seconds = time.perf_counter() - t0
    return summary


def generate_file(app: LocalApp, batch: BatchInput, output_path: Path,
                  params_for: Callable[[ServedModel], SamplingParams], max_in_flight: int = 64,
                  progress: Progress | None = None) -> BatchSummary:
    """Load the app's model, run the lines, stop the engine. `params_for(model)`: the command's sampling
    values over the model's generation_config (its max_tokens bounds the replies of lines that set none)."""

    async def main() -> BatchSummary:
        async with running(app):
            server = app.server
            defaults = params_for(server.registry.get(server.model_name).served)
            server.settings.max_tokens_default = defaults.max_tokens
            return await run_lines(app, batch, output_path, defaults, max_in_flight, progress)

    return asyncio.run(main())
