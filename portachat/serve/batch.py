"""Batch inference over a JSONL file: `portachat generate --input prompts.jsonl --output out.jsonl`.

Every input row is a prompt (`{"prompt": "..."}`, continued as plain text) or a conversation
(`{"messages": [...]}`, answered as the assistant), with an optional `id` and optional per-row
sampling fields (max_tokens, temperature, top_p, top_k, seed, stop) and an optional output
constraint in the server's spellings (`response_format`, `structured_outputs`, `guided_json`, ...).
All rows go through one engine, so they are batched continuously.

The output is written one row at a time (append + flush + fsync), so an interrupted run keeps
every finished row; running the same command again skips the rows already in the output and
repairs a last line cut short by a crash (serve/jsonl_rows.py, which the server's /v1/batches
shares).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from portachat.engine.sampling_params import SamplingError, SamplingFallback, with_fields
from portachat.engine.structured import StructuredError
from portachat.engine.structured.fields import structured_spec
from portachat.engine.types import EngineError, SamplingParams
from portachat.i18n import _
from portachat.serve.jsonl_rows import BatchInputError, RowWriter, done_ids, json_lines
from portachat.tokenizer.protocol import ChatTokenizer

ROW_PARAMS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop")

# `generate`'s own defaults for what neither a row, the flags nor the model's generation_config
# set: greedy, so a batch run is reproducible unless it asks for sampling.
GENERATE_FALLBACK = SamplingFallback(temperature=0.0, max_tokens=256)


@dataclass
class BatchRow:
    line: int  # 1-based line number in the input
    row_id: str
    prompt_ids: list[int]
    params: SamplingParams


@dataclass
class BatchSummary:
    total: int
    skipped: int  # already in the output from an earlier run
    written: int
    completion_tokens: int
    seconds: float


def read_rows(
    path: Path, tokenizer: ChatTokenizer, defaults: SamplingParams, prepend_bos: bool = False
) -> list[BatchRow]:
    """Parse and validate the whole input before anything runs: a bad line 9000 should not cost
    an hour of generation first."""
    rows: list[BatchRow] = []
    seen: set[str] = set()
    with open(path, encoding="utf-8") as f:
        for n, obj in json_lines(f, str(path)):
            rows.append(_parse_row(obj, n, path, tokenizer, defaults, prepend_bos))
            if rows[-1].row_id in seen:
                raise BatchInputError(_("{where}: id {id} repeats an earlier row; ids must be unique").format(
                    where=f"{path}:{n}", id=repr(rows[-1].row_id)))
            seen.add(rows[-1].row_id)
    if not rows:
        raise BatchInputError(_("{path} has no rows: expected one JSON object per line with 'prompt' or "
                                "'messages'").format(path=path))
    return rows


def _parse_row(
    obj: Any, n: int, path: Path, tokenizer: ChatTokenizer, defaults: SamplingParams, prepend_bos: bool
) -> BatchRow:
    where = f"{path}:{n}"
    if not isinstance(obj, dict):
        raise BatchInputError(_("{where}: expected a JSON object, got {type}").format(
            where=where, type=type(obj).__name__))
    row_id = str(obj.get("id", n))
    if "messages" in obj:
        try:
            prompt_ids = tokenizer.render_prompt(obj["messages"])
        except (ValueError, TypeError, KeyError) as exc:
            raise BatchInputError(_("{where}: bad 'messages': {error}").format(where=where, error=exc)) from None
    elif isinstance(obj.get("prompt"), str) and obj["prompt"]:
        # Our own models were pretrained on BOS-led documents; existing models' tokenizers decide themselves.
        bos = [tokenizer.bos_id] if prepend_bos and tokenizer.bos_id is not None else []
        prompt_ids = bos + tokenizer.encode(obj["prompt"])
    else:
        raise BatchInputError(_("{where}: each row needs a non-empty 'prompt' string or a 'messages' list").format(
            where=where))
    try:
        constraint = structured_spec(obj)
    except StructuredError as exc:
        raise BatchInputError(_("{where}: {error}").format(where=where, error=exc)) from None
    try:  # the row's fields over the command's (flags > the model's generation_config > GENERATE_FALLBACK)
        params = with_fields(defaults, {k: obj[k] for k in ROW_PARAMS if k in obj})
    except SamplingError as exc:
        raise BatchInputError(_("{where}: {error}").format(where=where, error=exc)) from None
    if constraint is not None:
        params = replace(params, structured=constraint)
    return BatchRow(line=n, row_id=row_id, prompt_ids=prompt_ids, params=params)


def run_batch(
    engine,
    tokenizer: ChatTokenizer,
    input_path: Path,
    output_path: Path,
    defaults: SamplingParams,
    max_in_flight: int = 64,
    prepend_bos: bool = False,
    progress: Callable[[int, int, int, float], None] | None = None,
) -> BatchSummary:
    """Generate every row of `input_path` not yet in `output_path`.

    `engine` is an LLMEngine; `progress(done, total, completion_tokens, seconds)` is called as rows finish.
    """
    rows = read_rows(input_path, tokenizer, defaults, prepend_bos)
    done = done_ids(output_path)
    todo: Iterator[BatchRow] = iter([r for r in rows if r.row_id not in done])
    skipped = sum(1 for r in rows if r.row_id in done)
    writer = RowWriter(output_path)
    in_flight: dict[str, tuple[BatchRow, list[str], list[int]]] = {}
    written = tokens = 0
    t0 = time.perf_counter()
    exhausted = False
    try:
        while True:
            while not exhausted and len(in_flight) < max_in_flight:
                row = next(todo, None)
                if row is None:
                    exhausted = True
                    break
                # Replies are capped at the room the context leaves (a prompt that fills it fails below).
                room = engine.max_model_len - len(row.prompt_ids)
                params = replace(row.params, max_tokens=max(1, min(row.params.max_tokens, room)))
                try:
                    rid = engine.add_request(row.prompt_ids, params, request_id=f"row-{row.row_id}")
                except EngineError as exc:
                    if exc.kind == "queue_full":  # come back after a step frees room
                        todo = _prepend(row, todo)
                        break
                    raise BatchInputError(_("{where}: {error}").format(
                        where=f"{input_path}:{row.line}", error=exc)) from None
                in_flight[rid] = (row, [], [])
            if not in_flight:
                break
            for out in engine.step():
                if out.request_id not in in_flight:
                    continue
                row, texts, ids = in_flight[out.request_id]
                texts.append(out.text)
                ids.extend(out.token_ids)
                if out.finished:
                    del in_flight[out.request_id]
                    record = {
                        "id": row.row_id,
                        "output": "".join(texts),
                        "finish_reason": out.finish_reason,
                        "prompt_tokens": len(row.prompt_ids),
                        "completion_tokens": len(ids),
                    }
                    if out.error:
                        record["error"] = out.error
                    writer.write(record)
                    written += 1
                    tokens += len(ids)
                    if progress is not None:
                        progress(skipped + written, len(rows), tokens, time.perf_counter() - t0)
    finally:
        for rid in list(in_flight):
            engine.abort(rid)
        writer.close()
    return BatchSummary(len(rows), skipped, written, tokens, time.perf_counter() - t0)


def _prepend(row: BatchRow, rest: Iterator[BatchRow]) -> Iterator[BatchRow]:
    yield row
    yield from rest
