"""A batch's input lines: read and checked before any runs (OpenAI's format, one request a line:
`{"custom_id", "method": "POST", "url", "body"}`), then each run through the very route handler an
interactive request of that endpoint goes through, so a line's answer is what the same request sent
over HTTP would get. `portachat generate` checks and runs its lines with these same functions
(serve/batch.py); the resume by id and the durable output are shared too (serve/jsonl_rows.py)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from portachat.i18n import _
from portachat.serve.api.completions import chat_completions, completions
from portachat.serve.api.embeddings import EmbeddingRequest, embeddings
from portachat.serve.api.errors import APIError, api_error_response, error_response
from portachat.serve.api.protocol import ChatCompletionRequest, CompletionRequest, check_supported, parse_body
from portachat.serve.api.request_params import check_sampling, output_constraint
from portachat.serve.api.state import ServerState
from portachat.serve.jsonl_rows import BatchInputError, json_line

Handler = Callable[[Request], Awaitable[Response]]
HANDLERS: dict[str, tuple[Handler, type]] = {
    "/v1/chat/completions": (chat_completions, ChatCompletionRequest),
    "/v1/completions": (completions, CompletionRequest),
    "/v1/embeddings": (embeddings, EmbeddingRequest),
}
MAX_LINES = 50_000  # OpenAI's limit on requests per batch
MAX_REPORTED_ERRORS = 100  # a file of 50,000 bad lines reports the first ones


@dataclass
class BatchLine:
    line: int  # 1-based, in the input file
    custom_id: str
    body: bytes  # the request body, as JSON
    endpoint: str  # the line's url: one of HANDLERS


def _error(line: int, message: str, code: str = "invalid_request", param: str | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


def check_body(body: Any, endpoint: str, server: ServerState) -> None:
    """What the route itself would refuse before running the request (APIError) and can tell without
    the model: the body's fields, the sampling fields' ranges, the output constraint, options the
    server does not implement, the model name. Streaming has no place in a batch."""
    _handler, model = HANDLERS[endpoint]
    req = parse_body(json.dumps(body).encode(), model)
    if getattr(req, "stream", False):
        raise APIError(400, _("'stream' cannot be true in a batch: each answer goes to the output file whole."),
                       param="body.stream")
    if isinstance(req, ChatCompletionRequest | CompletionRequest):
        check_supported(req)
        check_sampling(req)
        output_constraint(req)
    server.resolve(req.model)


def read_lines(data: bytes, endpoint: str | None, server: ServerState, where: str = "input",
               to_request: Callable[[int, Any], Any] | None = None,
               max_lines: int | None = MAX_LINES) -> tuple[list[BatchLine], list[dict[str, Any]]]:
    """Every line checked: the requests to run, or the errors (each naming its line) that fail the batch.

    `endpoint`: the batch's, which every line's url must be; None: each line names its own (one of
    HANDLERS). `to_request(n, obj)` turns another format's parsed line into a request line first
    (`portachat generate`'s rows); its BatchInputError is that line's error. `max_lines`: None = no limit."""
    lines: list[BatchLine] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [], [_error(0, _("The input file is not UTF-8 text ({error}).").format(error=exc), "invalid_file")]
    # split("\n"), not splitlines(): a JSON string may hold U+2028 and other line separators unescaped.
    for n, raw in enumerate(text.split("\n"), start=1):
        if len(errors) >= MAX_REPORTED_ERRORS:
            break
        if not raw.strip():
            continue
        try:
            obj = json_line(raw, where, n)
        except BatchInputError as exc:
            errors.append(_error(n, exc.reason or str(exc), "invalid_json_line"))
            continue
        if to_request is not None:
            try:
                obj = to_request(n, obj)
            except BatchInputError as exc:
                errors.append(_error(n, exc.reason or str(exc), "invalid_request"))
                continue
        problem = _check_line(obj, endpoint, seen, server)
        if problem is not None:
            errors.append(_error(n, *problem))
            continue
        seen.add(obj["custom_id"])
        lines.append(BatchLine(n, obj["custom_id"], json.dumps(obj["body"], ensure_ascii=False).encode(), obj["url"]))
    if not lines and not errors:
        errors.append(_error(0, _("The input file has no requests: send one JSON object a line with custom_id, "
                                  "method, url and body."), "empty_file"))
    if max_lines is not None and len(lines) > max_lines:
        errors.append(_error(0, _("The input file has {count} requests; a batch takes at most {limit}: split it.").format(
            count=len(lines), limit=max_lines), "too_many_requests"))
    return lines, errors


def _check_line(obj: Any, endpoint: str | None, seen: set[str], server: ServerState) -> tuple[str, str, str | None] | None:
    """(message, code, param) of what is wrong with one parsed line, None when it can run."""
    if not isinstance(obj, dict):
        return _("Expected a JSON object, got {type}.").format(type=type(obj).__name__), "invalid_request", None
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return _("Missing required parameter: 'custom_id' (a non-empty string naming the request)."), \
            "missing_required_parameter", "custom_id"
    if custom_id in seen:
        return _("The custom_id {id} repeats an earlier line; each request needs its own.").format(
            id=repr(custom_id)), "duplicate_custom_id", "custom_id"
    if obj.get("method", "POST") != "POST":
        return _("Only method POST is supported (got {method}).").format(method=repr(obj.get("method"))), \
            "invalid_method", "method"
    if endpoint is None and obj.get("url") not in HANDLERS:
        return _("The url {url} is not an endpoint a batch runs ({endpoints}).").format(
            url=repr(obj.get("url")), endpoints=", ".join(HANDLERS)), "invalid_url", "url"
    if endpoint is not None and obj.get("url") != endpoint:
        return _("The url {url} differs from the batch's endpoint {endpoint}: every line must call the batch's "
                 "endpoint.").format(url=repr(obj.get("url")), endpoint=endpoint), "mismatched_endpoint", "url"
    if not isinstance(obj.get("body"), dict):
        return _("Missing required parameter: 'body' (the request, a JSON object)."), "missing_required_parameter", \
            "body"
    try:
        check_body(obj["body"], obj["url"], server)
    except APIError as exc:
        param = f"body.{exc.param}" if exc.param and not exc.param.startswith("body.") else exc.param
        return exc.message, exc.code or "invalid_request", param
    return None


async def run_line(app: Any, endpoint: str, owner: str, admin: bool, body: bytes) -> tuple[int, Any]:
    """One request through its route's handler, as if `owner`'s key had sent it: (status, JSON body)."""
    handler, _model = HANDLERS[endpoint]
    delivered = False
    never = asyncio.get_running_loop().create_future()

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await never  # no client can leave a batch; cancelling the line is what stops it

    scope = {"type": "http", "method": "POST", "path": endpoint, "raw_path": endpoint.encode(), "query_string": b"",
             "headers": [(b"content-type", b"application/json")], "app": app,
             "state": {"owner": owner, "admin": admin}}
    try:
        response = await handler(Request(scope, receive))
    except APIError as exc:
        response = api_error_response(exc)
    except Exception as exc:  # noqa: BLE001 - as the app's own handler: one failed request, the batch goes on
        response = error_response(500, _("Internal server error: {error_type}: {exc}").format(
                                         error_type=type(exc).__name__, exc=exc), code="internal_error")
    finally:
        never.cancel()
    return response.status_code, json.loads(response.body)


def output_record(custom_id: str, status: int, body: Any) -> dict[str, Any]:
    """A line of the output or error file, in OpenAI's shape."""
    return {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": custom_id,
            "response": {"status_code": status, "request_id": f"req_{uuid.uuid4().hex}", "body": body},
            "error": None}
