"""OpenAI's Batch API over the Files API:

    POST /v1/batches                {input_file_id, endpoint, completion_window: "24h", metadata}
    GET  /v1/batches                (?after=ID&limit=N: this key's batches, newest first)
    GET  /v1/batches/{batch_id}
    POST /v1/batches/{batch_id}/cancel

The input is a file uploaded with purpose "batch": one request a line, `{"custom_id", "method":
"POST", "url", "body"}`, for /v1/chat/completions, /v1/completions or /v1/embeddings. Every line is
checked before any runs; one bad line fails the batch, its errors naming the lines
(batch_lines.py). The answers go to an output file (2xx) and an error file, each line
`{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`, downloaded with
GET /v1/files/{id}/content. Jobs live under PORTACHAT_HOME and resume after a restart
(batch_runner.py); each belongs to the API key that created it."""

from __future__ import annotations

import time
import uuid

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from portachat.i18n import _
from portachat.serve.api.batch_lines import HANDLERS
from portachat.serve.api.batch_runner import BatchRunner
from portachat.serve.api.batch_store import BatchJob
from portachat.serve.api.documents import doc_store, owned_file
from portachat.serve.api.errors import APIError
from portachat.serve.api.owner import request_is_admin, request_owner
from portachat.serve.api.protocol import parse_body

MAX_LIST = 100  # OpenAI's bound on `limit`


class BatchCreate(BaseModel):
    model_config = ConfigDict(extra="ignore")
    input_file_id: str
    endpoint: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = Field(default=None, max_length=16)


def runner(request: Request) -> BatchRunner:
    return request.app.state.batch_runner


def owned_batch(request: Request, batch_id: str) -> BatchJob:
    """The batch when the request's API key created it; 404 when there is none, else 403."""
    job = runner(request).jobs.get(batch_id)
    if job is None:
        raise APIError(404, _("No batch with id '{id}' (GET /v1/batches lists them).").format(id=batch_id),
                       param="batch_id", code="not_found")
    if job.owner != request_owner(request):
        raise APIError(403, _("The batch '{id}' belongs to another API key; each key sees only the batches it "
                              "made.").format(id=batch_id), param="batch_id", code="permission_denied")
    return job


async def create_batch(request: Request) -> Response:
    req = parse_body(await request.body(), BatchCreate)
    if req.endpoint not in HANDLERS:
        raise APIError(400, _("Invalid value for 'endpoint': {endpoint} (a batch runs {endpoints}).").format(
            endpoint=repr(req.endpoint), endpoints=", ".join(HANDLERS)), param="endpoint", code="invalid_value")
    if req.completion_window != "24h":
        raise APIError(400, _("Invalid value for 'completion_window': {value} (only \"24h\" is supported).").format(
            value=repr(req.completion_window)), param="completion_window", code="invalid_value")
    row = await owned_file(request, req.input_file_id)
    if row["purpose"] != "batch":
        raise APIError(400, _("The file '{id}' was uploaded with purpose {purpose}; a batch's input needs purpose "
                              "\"batch\" (upload it again with purpose=\"batch\").").format(
            id=row["id"], purpose=repr(row["purpose"])), param="input_file_id", code="invalid_value")
    data = await run_in_threadpool(doc_store(request).file_bytes, row["id"])
    job = BatchJob(id=f"batch_{uuid.uuid4().hex}", owner=request_owner(request), admin=request_is_admin(request),
                   endpoint=req.endpoint, input_file_id=row["id"], completion_window=req.completion_window,
                   created_at=int(time.time()), metadata=req.metadata)
    jobs = runner(request)
    await run_in_threadpool(jobs.store.create, job, data)
    jobs.start(job)
    return JSONResponse(job.openai())


async def get_batch(request: Request) -> Response:
    return JSONResponse(owned_batch(request, request.path_params["batch_id"]).openai())


async def cancel_batch(request: Request) -> Response:
    job = owned_batch(request, request.path_params["batch_id"])
    if job.status not in ("validating", "in_progress"):
        raise APIError(409, _("The batch '{id}' is {status} and cannot be cancelled (only a validating or "
                              "in_progress batch can).").format(id=job.id, status=job.status), param="batch_id",
                       code="invalid_state")
    runner(request).cancel(job)
    return JSONResponse(job.openai())


async def list_batches(request: Request) -> Response:
    try:
        limit = int(request.query_params.get("limit", 20))
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_LIST:
        raise APIError(400, _("Invalid value for 'limit': it must be an integer from 1 to {max}.").format(max=MAX_LIST),
                       param="limit", code="invalid_value")
    owner = request_owner(request)
    jobs = sorted((j for j in runner(request).jobs.values() if j.owner == owner),
                  key=lambda j: (j.created_at, j.id), reverse=True)
    after = request.query_params.get("after")
    if after:
        ids = [j.id for j in jobs]
        jobs = jobs[ids.index(after) + 1:] if after in ids else []
    page = [j.openai() for j in jobs[:limit]]
    return JSONResponse({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                         "last_id": page[-1]["id"] if page else None, "has_more": len(jobs) > limit})


ROUTES = [
    ("/v1/batches", create_batch, "POST"), ("/v1/batches", list_batches, "GET"),
    ("/v1/batches/{batch_id}", get_batch, "GET"), ("/v1/batches/{batch_id}/cancel", cancel_batch, "POST"),
]
