"""OpenAI's Files and vector-store routes over the document store (portachat/serve/docs):
    POST /v1/files (multipart: file, purpose)      GET /v1/files     GET/DELETE /v1/files/{file_id}
    POST/GET /v1/vector_stores                     GET/DELETE /v1/vector_stores/{id}
    POST/GET /v1/vector_stores/{id}/files          GET/DELETE /v1/vector_stores/{id}/files/{file_id}
    POST /v1/vector_stores/{id}/search             ({query, max_num_results} -> passages with scores)

    GET /v1/files/{file_id}/content                (the uploaded bytes)

Attaching a file chunks and embeds it before answering (status "completed", or "failed" with
last_error for a file without readable text), with the server's embedding model: `--embedding-model
NAME`, else the first embedding model registered.

Files and vector stores belong to the API key that made them (serve/api/owner.py): another key gets
403 for them (the issue asked for 403; ids are random, so the status leaks nothing worth hiding) and
never sees them listed. Id lists are de-duplicated and capped; the store's quota (--docs-max-bytes,
--docs-max-files) answers 400 in OpenAI's shape."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from portachat.i18n import _
from portachat.model.source import EMBEDDING, resolve
from portachat.serve.api.errors import APIError
from portachat.serve.api.owner import request_owner
from portachat.serve.api.protocol import MAX_RESULTS, parse_body
from portachat.serve.api.state import ModelLease, ServerState
from portachat.serve.docs import DocStore, Hit, StoreError
from portachat.serve.docs.ingest import TextEmbedder, attach_file, search, text_embedder

MAX_FILE_IDS = 500  # OpenAI's cap on file_ids in one request (vector store create, file batches)
DOCS_MAX_BYTES = 8 * 2**30  # `portachat serve` defaults of --docs-max-bytes / --docs-max-files
DOCS_MAX_FILES = 10_000


class StoreCreate(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str | None = None
    file_ids: list[str] = Field(default_factory=list, max_length=MAX_FILE_IDS)
    metadata: dict[str, str] | None = None


class FileAttach(BaseModel):
    model_config = ConfigDict(extra="ignore")
    file_id: str


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    query: str | list[str]
    max_num_results: int = Field(10, ge=1, le=MAX_RESULTS)


# ------------------------------------------------------------------------------------------ shapes


def file_object(row: dict) -> dict:
    return {"id": row["id"], "object": "file", "bytes": row["bytes"], "created_at": row["created_at"],
            "filename": row["filename"], "purpose": row["purpose"], "status": "processed", "expires_at": None,
            "status_details": None}


def store_object(store: DocStore, row: dict) -> dict:
    return {"id": row["id"], "object": "vector_store", "created_at": row["created_at"], "name": row["name"],
            "usage_bytes": store.usage_bytes(row["id"]), "file_counts": store.file_counts(row["id"]),
            "status": "completed", "expires_after": None, "expires_at": None, "last_active_at": row["created_at"],
            "metadata": _json(row["metadata"]) or {}, "embedding_model": row["embedding_model"]}


def store_file_object(row: dict) -> dict:
    return {"id": row["file_id"], "object": "vector_store.file", "usage_bytes": row["usage_bytes"],
            "created_at": row["created_at"], "vector_store_id": row["vector_store_id"], "status": row["status"],
            "last_error": json.loads(row["last_error"]) if row["last_error"] else None,
            "chunking_strategy": _json(row["chunking"]) or {"type": "other"}, "attributes": {"chunks": row["chunks"]}}


def hit_object(hit: Hit) -> dict:
    return {"file_id": hit.file_id, "filename": hit.filename, "score": round(hit.score, 6),
            "attributes": {"chunk_index": hit.chunk_index, "start": hit.start, "end": hit.end},
            "content": [{"type": "text", "text": hit.text}]}


def _json(text: str | None) -> Any:
    return json.loads(text) if text else None


def _list(data: list[dict]) -> JSONResponse:
    return JSONResponse({"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                         "last_id": data[-1]["id"] if data else None, "has_more": False})


# ------------------------------------------------------------------------------------------ plumbing


def doc_store(request: Request) -> DocStore:
    """The app's store under PORTACHAT_HOME/docs, opened on first use with the server's quota."""
    return app_doc_store(request.app)


def app_doc_store(app: Any) -> DocStore:
    """`doc_store` for code without a request (the batch runner writing its output files)."""
    store = getattr(app.state, "doc_store", None)
    if store is None:
        server = getattr(app.state, "server", None)
        settings = getattr(server, "settings", None)
        store = app.state.doc_store = DocStore(
            max_bytes=getattr(settings, "docs_max_bytes", DOCS_MAX_BYTES),
            max_files=getattr(settings, "docs_max_files", DOCS_MAX_FILES))
    return store


async def _call(fn, *args: Any) -> Any:
    """A store call off the event loop, its StoreError as the API's error."""
    try:
        return await run_in_threadpool(fn, *args)
    except StoreError as exc:
        raise APIError(exc.status, str(exc), param=exc.param, code=exc.code) from None


def unique(ids: list[str]) -> list[str]:
    """The ids once each, in order (the same file listed 100 times is attached once)."""
    return list(dict.fromkeys(ids))


async def owned_file(request: Request, file_id: str) -> dict:
    """The file's row when the request's API key made it; 404 when there is none, else 403."""
    row = await _call(doc_store(request).file, file_id)
    if row["owner"] != request_owner(request):
        raise APIError(403, _("The file '{id}' belongs to another API key; each key sees only the files and "
                              "vector stores it made.").format(id=file_id),
                       param="file_id", code="permission_denied")
    return row


async def owned_store(request: Request, store_id: str) -> dict:
    """The vector store's row when the request's API key made it; 404 when there is none, else 403."""
    row = await _call(doc_store(request).store, store_id)
    if row["owner"] != request_owner(request):
        raise APIError(403, _("The vector store '{id}' belongs to another API key; each key sees only the files "
                              "and vector stores it made.").format(id=store_id), param="vector_store_id",
                       code="permission_denied")
    return row


def _is_embedding_entry(entry: Any) -> bool:
    served = entry.served
    if served is not None:
        return served.engine is None and served.embedder is not None
    if not entry.spec.path:
        return False

    try:  # the source the catalog resolved, when it did
        return (entry.spec.source or resolve(entry.spec.path)).kind == EMBEDDING
    except Exception:  # noqa: BLE001 - an unreadable model is not an embedding model we can use
        return False


def embedding_model_name(server: ServerState) -> str:
    """`--embedding-model NAME`, else the first embedding model registered; 400 when there is none."""
    name = getattr(server.settings, "embedding_model", None)
    if name:
        return server.resolve(name)
    for entry in server.registry.entries.values():
        if _is_embedding_entry(entry):
            return entry.name
    raise APIError(400, _("This server has no embedding model for document search: add one with --model "
                          "NAME=PATH (e.g. --model minilm=/path/to/all-MiniLM-L6-v2) and, if several, pick "
                          "it with --embedding-model NAME."),
                   param="embedding_model", code="no_embedding_model")


class EmbeddingLease:
    """The server's embedding model held for one document operation (`async with`)."""

    def __init__(self, server: ServerState) -> None:
        self.server = server
        self.lease: ModelLease | None = None

    async def __aenter__(self) -> TextEmbedder:
        name = embedding_model_name(self.server)
        self.lease = lease = await self.server.acquire(name, None, generation=False)
        embedder, queue = lease.embedder, lease.embedding_queue
        if embedder is None or queue is None:
            lease.release()
            raise APIError(400, _("The model '{name}' does not make embeddings; name an embedding model "
                                  "with --embedding-model.").format(name=name),
                           param="embedding_model", code="model_not_supported")

        def embed(texts: list[str]):
            return queue.submit([embedder.truncate(embedder.tokenize(t)) for t in texts]).result()

        return text_embedder(embedder, name, embed)

    async def __aexit__(self, *exc: Any) -> None:
        if self.lease is not None:
            self.lease.release()


# ------------------------------------------------------------------------------------------ files


async def create_file(request: Request) -> Response:
    try:
        form = await request.form()
    except Exception as exc:  # noqa: BLE001 - malformed multipart bodies
        raise APIError(400, _("Send the file as multipart/form-data with fields 'file' and 'purpose' "
                              "({exc}).").format(exc=exc),
                       param="file") from None
    upload = form.get("file")
    if upload is None or isinstance(upload, str):
        raise APIError(400, _("Missing required parameter: 'file' (a multipart file field)."), param="file")
    purpose = form.get("purpose")
    if not isinstance(purpose, str) or not purpose:
        raise APIError(400, _("Missing required parameter: 'purpose' (send \"assistants\" for documents)."),
                       param="purpose")
    data = await upload.read()
    if not data:
        raise APIError(400, _("The file '{filename}' is empty.").format(filename=upload.filename),
                       param="file")
    row = await _call(doc_store(request).add_file, upload.filename or "upload", data, purpose, request_owner(request))
    return JSONResponse(file_object(row))


async def list_files(request: Request) -> Response:
    purpose = request.query_params.get("purpose")
    rows = await _call(doc_store(request).files, request_owner(request))
    return _list([file_object(r) for r in rows if purpose in (None, r["purpose"])])


async def get_file(request: Request) -> Response:
    return JSONResponse(file_object(await owned_file(request, request.path_params["file_id"])))


async def file_content(request: Request) -> Response:
    row = await owned_file(request, request.path_params["file_id"])
    data = await _call(doc_store(request).file_bytes, row["id"])
    return Response(data, media_type="application/octet-stream")


async def delete_file(request: Request) -> Response:
    file_id = request.path_params["file_id"]
    await owned_file(request, file_id)
    await _call(doc_store(request).delete_file, file_id)
    return JSONResponse({"id": file_id, "object": "file", "deleted": True})


# ------------------------------------------------------------------------------------------ vector stores


async def create_store(request: Request) -> Response:
    req = parse_body(await request.body(), StoreCreate)
    store, owner = doc_store(request), request_owner(request)
    file_ids = unique(req.file_ids)
    for file_id in file_ids:  # all exist (and are this key's) before anything is made
        await owned_file(request, file_id)
    if not file_ids:
        row = await _call(store.create_store, req.name or "", req.metadata, owner)
        return JSONResponse(store_object(store, row))
    async with EmbeddingLease(request.app.state.server) as model:  # a model to embed them, too
        row = await _call(store.create_store, req.name or "", req.metadata, owner)
        try:
            for file_id in file_ids:
                await _call(attach_file, store, row["id"], file_id, model)
        except APIError:  # e.g. the quota: no half-made store is left behind
            await _call(store.delete_store, row["id"])
            raise
    return JSONResponse(store_object(store, await _call(store.store, row["id"])))


async def list_stores(request: Request) -> Response:
    store = doc_store(request)
    rows = await _call(store.stores, request_owner(request))
    return _list([store_object(store, r) for r in rows])


async def get_store(request: Request) -> Response:
    row = await owned_store(request, request.path_params["vector_store_id"])
    return JSONResponse(store_object(doc_store(request), row))


async def delete_store(request: Request) -> Response:
    store_id = request.path_params["vector_store_id"]
    await owned_store(request, store_id)
    await _call(doc_store(request).delete_store, store_id)
    return JSONResponse({"id": store_id, "object": "vector_store.deleted", "deleted": True})


async def attach(request: Request) -> Response:
    store_id = request.path_params["vector_store_id"]
    req = parse_body(await request.body(), FileAttach)
    store = doc_store(request)
    await owned_store(request, store_id)
    await owned_file(request, req.file_id)
    async with EmbeddingLease(request.app.state.server) as model:
        row = await _call(attach_file, store, store_id, req.file_id, model)
    return JSONResponse(store_file_object(row))


async def list_store_files(request: Request) -> Response:
    store_id = request.path_params["vector_store_id"]
    await owned_store(request, store_id)
    rows = await _call(doc_store(request).store_files, store_id)
    return _list([store_file_object(r) for r in rows])


async def get_store_file(request: Request) -> Response:
    p = request.path_params
    await owned_store(request, p["vector_store_id"])
    return JSONResponse(store_file_object(await _call(doc_store(request).store_file, p["vector_store_id"], p["file_id"])))


async def detach(request: Request) -> Response:
    p = request.path_params
    await owned_store(request, p["vector_store_id"])
    await _call(doc_store(request).remove_file, p["vector_store_id"], p["file_id"])
    return JSONResponse({"id": p["file_id"], "object": "vector_store.file.deleted", "deleted": True})


async def search_store(request: Request) -> Response:
    store_id = request.path_params["vector_store_id"]
    req = parse_body(await request.body(), SearchRequest)
    query = req.query if isinstance(req.query, str) else " ".join(req.query)
    hits = await search_hits(request, [store_id], query, req.max_num_results)
    return JSONResponse({"object": "vector_store.search_results.page", "search_query": [query],
                         "data": [hit_object(h) for h in hits], "has_more": False, "next_page": None})


async def search_hits(request: Request, store_ids: list[str], query: str, k: int) -> list[Hit]:
    """The k best passages over the vector stores (the search route and grounded chat), each of them
    the request's API key's."""
    store = doc_store(request)
    store_ids = unique(store_ids)
    for store_id in store_ids:
        await owned_store(request, store_id)
    async with EmbeddingLease(request.app.state.server) as model:
        hits = [h for store_id in store_ids for h in await _call(search, store, store_id, query, model, k)]
    return sorted(hits, key=lambda h: -h.score)[:k]


ROUTES = [
    ("/v1/files", create_file, "POST"), ("/v1/files", list_files, "GET"),
    ("/v1/files/{file_id}", get_file, "GET"), ("/v1/files/{file_id}", delete_file, "DELETE"),
    ("/v1/files/{file_id}/content", file_content, "GET"),
    ("/v1/vector_stores", create_store, "POST"), ("/v1/vector_stores", list_stores, "GET"),
    ("/v1/vector_stores/{vector_store_id}", get_store, "GET"),
    ("/v1/vector_stores/{vector_store_id}", delete_store, "DELETE"),
    ("/v1/vector_stores/{vector_store_id}/files", attach, "POST"),
    ("/v1/vector_stores/{vector_store_id}/files", list_store_files, "GET"),
    ("/v1/vector_stores/{vector_store_id}/files/{file_id}", get_store_file, "GET"),
    ("/v1/vector_stores/{vector_store_id}/files/{file_id}", detach, "DELETE"),
    ("/v1/vector_stores/{vector_store_id}/search", search_store, "POST"),
]
