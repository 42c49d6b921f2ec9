"""The FastAPI app: OpenAI routes, /health, /metrics, the chat page, and the guards around them."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware

from portachat import __version__
from portachat.i18n import _
from portachat.serve.api.adapters import ROUTES as ADAPTER_ROUTES
from portachat.serve.api.anthropic import messages
from portachat.serve.api.batch_runner import BatchRunner
from portachat.serve.api.batches import ROUTES as BATCH_ROUTES
from portachat.serve.api.completions import chat_completions, completions
from portachat.serve.api.documents import ROUTES as DOCUMENT_ROUTES
from portachat.serve.api.embeddings import embeddings
from portachat.serve.api.errors import APIError, api_error_response, error_response
from portachat.serve.api.limits import APIKeyCheck, BodySizeLimit
from portachat.serve.api.metrics import ServerMetrics
from portachat.serve.api.openapi import openapi_schema
from portachat.serve.api.origin import RequestGuard
from portachat.serve.api.protocol import json_body
from portachat.serve.api.responses import ROUTES as RESPONSE_ROUTES
from portachat.serve.api.state import ServedModel, ServerSettings, ServerState
from portachat.serve.api.submission import ClientGone
from portachat.serve.api.tokenize import tokenize
from portachat.serve.registry import ModelRegistry, ModelSpec, RegistryEntry
from portachat.serve.registry.keep_alive import describe_keep_alive
from portachat.serve.registry.registry import LoadFailed, NoRoom

Loader = Callable[[], ServedModel]


def chat_page_html() -> str:
    """The web chat page, read from the package (works from an editable install and a wheel)."""
    return resources.files("portachat.serve").joinpath("web/index.html").read_text(encoding="utf-8")


def single_model_registry(name: str, loader: Loader) -> ModelRegistry:
    """One model, loaded at start-up and kept (the classic `serve --model PATH`)."""
    return ModelRegistry([ModelSpec(name, "", pinned=True)], loader=lambda spec: loader())


def _wire_events(registry: ModelRegistry, metrics: ServerMetrics) -> None:
    def on_loaded(entry: RegistryEntry, seconds: float) -> None:
        metrics.on_loaded(entry.name, entry.size_bytes, seconds)
        if entry.spec.path:  # on-demand loads in a multi-model server: say so in the log
            print("[portachat] " + _("loaded {name} in {seconds:.1f} s ({gib:.2f} GiB)").format(
                name=entry.name, seconds=seconds, gib=entry.size_bytes / 2**30), file=sys.stderr, flush=True)

    def on_unloaded(entry: RegistryEntry, reason: str) -> None:
        metrics.on_unloaded(entry.name, reason)
        if reason != "shutdown":
            print("[portachat] " + _("unloaded {name}: {reason}").format(name=entry.name, reason=reason),
                  file=sys.stderr, flush=True)

    registry.events.observer = metrics.observer
    registry.events.on_loaded = on_loaded
    registry.events.on_unloaded = on_unloaded


async def _load_at_startup(state: ServerState, on_error: Callable[[BaseException], None] | None) -> None:
    try:
        for spec in state.registry.specs:
            if spec.pinned:
                await state.registry.load(spec.name)
    except (LoadFailed, NoRoom) as exc:
        state.load_error = str(exc)
        if on_error is not None:
            on_error(exc.__cause__ or exc)
    finally:
        state.starting = False


def _server(request: Request) -> ServerState:
    return request.app.state.server


async def health(request: Request) -> Response:
    status, body = _server(request).health()
    return JSONResponse(body, status_code=status)


async def models(request: Request) -> Response:
    state = _server(request)
    state.require_ready()
    return JSONResponse({"object": "list",
                         "data": [_model_card(state, e) for e in state.registry.entries.values()]})


async def load_model(request: Request) -> Response:
    """llama-server's router convention for explicit loads (requests also load on demand)."""
    state = _server(request)
    name = state.resolve(await _model_field(request))
    lease = await state.acquire(name)
    lease.release()
    return JSONResponse({"success": True, "model": name, "status": lease.entry.state})


async def unload_model(request: Request) -> Response:
    state = _server(request)
    registry = state.registry
    name = state.resolve(await _model_field(request))
    if registry.get(name).spec.pinned and not state.settings.allow_unload:
        raise APIError(403, _("The model '{name}' was given at start-up (--model) and clients may not unload it: "
                              "restart the server with --allow-unload to allow that.").format(name=name),
                       param="model", code="unload_not_allowed")
    if not await registry.unload(name):
        raise APIError(409, _("The model '{name}' has {in_flight} requests in flight; unload it when "
                              "they end (or send them with keep_alive 0).").format(
                              name=name, in_flight=registry.get(name).in_flight), param="model",
                       code="model_busy")
    return JSONResponse({"success": True, "model": name, "status": registry.get(name).state})


async def metrics(request: Request) -> Response:
    return Response(generate_latest(_server(request).metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def page() -> Response:
    return HTMLResponse(chat_page_html())


# Every route, one table: (path, handler, method). Each module's table lists its own.
ROUTES = [
    ("/health", health, "GET"), ("/v1/models", models, "GET"), ("/metrics", metrics, "GET"), ("/", page, "GET"),
    ("/models/load", load_model, "POST"), ("/models/unload", unload_model, "POST"),  # llama-server's router
    ("/v1/chat/completions", chat_completions, "POST"), ("/v1/completions", completions, "POST"),
    ("/v1/messages", messages, "POST"),  # Anthropic's Messages API
    ("/v1/embeddings", embeddings, "POST"), ("/tokenize", tokenize, "POST"),  # vLLM's: a text's token ids
    *DOCUMENT_ROUTES,  # /v1/files, /v1/vector_stores (document QA)
    *BATCH_ROUTES,  # /v1/batches (background jobs over /v1/files)
    *ADAPTER_ROUTES,  # /v1/load_lora_adapter, /v1/unload_lora_adapter
    *RESPONSE_ROUTES,  # /v1/responses (OpenAI's Responses API, stored responses)
]


def create_app(settings: ServerSettings, loader: Loader | None = None,
               on_load_error: Callable[[BaseException], None] | None = None,
               registry: ModelRegistry | None = None) -> FastAPI:
    """An app serving the models of `registry` (or the one model `loader` makes). Models given at
    start-up load on the server's loop at once (/health: 503 until done); the rest load on demand."""
    if registry is None:
        if loader is None:
            raise ValueError("create_app needs a loader or a registry")
        registry = single_model_registry(settings.served_model_name, loader)
    metrics = ServerMetrics(settings.served_model_name)
    _wire_events(registry, metrics)
    state = ServerState(settings, registry, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        state.created = int(time.time())
        tasks = [asyncio.ensure_future(_load_at_startup(state, on_load_error)),
                 asyncio.ensure_future(registry.reap_forever()), asyncio.ensure_future(app.state.batch_runner.run())]
        yield
        for task in tasks:
            task.cancel()
        state.accepting = False
        for engine in state.engines():
            engine.stop_accepting()
            engine.abort_all()
        await registry.shutdown()

    app = FastAPI(title="portachat", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.state.server = state

    def described() -> dict:  # FastAPI's /openapi.json calls this once and keeps the result
        if app.openapi_schema is None:
            app.openapi_schema = openapi_schema(app, __version__)
        return app.openapi_schema

    app.openapi = described

    @app.exception_handler(APIError)
    async def on_api_error(request: Request, exc: APIError) -> Response:
        state.metrics.on_http_error(exc.status)
        return api_error_response(exc)

    @app.exception_handler(ClientGone)
    async def on_client_gone(request: Request, exc: ClientGone) -> Response:
        return Response(status_code=499)  # nginx's "client closed request"; nobody reads it

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> Response:
        method, path = request.method, request.url.path
        message = {404: _("No route {method} {path}: see GET /v1/models, POST /v1/chat/completions, POST "
                          "/v1/completions, POST /v1/messages, POST /v1/responses, POST /v1/embeddings, /v1/files, "
                          "/v1/vector_stores, GET /health, GET /metrics, GET /openapi.json, GET /.").format(
                              method=method, path=path),
                   405: _("Method {method} is not allowed on {path}.").format(method=method, path=path),
                   }.get(exc.status_code, str(exc.detail))
        return error_response(exc.status_code, message)

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception) -> Response:
        state.metrics.on_http_error(500)
        return error_response(500, _("Internal server error: {error_type}: {exc}. The server keeps "
                                     "running; rerun `portachat serve` with --debug for the traceback.").format(
                                     error_type=type(exc).__name__, exc=exc), code="internal_error")

    app.state.batch_runner = BatchRunner(app)  # /v1/batches' jobs; the lifespan runs it
    for path, endpoint, method in ROUTES:
        app.add_api_route(path, endpoint, methods=[method])

    # Last added runs first: the Host/Origin/Content-Type guard, CORS (answers preflights), the size
    # limit (before anything reads the body), then the keys (which also say who called).
    app.add_middleware(APIKeyCheck, api_keys=settings.api_keys, admin_api_key=settings.admin_api_key)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes, upload_bytes=settings.max_upload_bytes)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["*"],
                           allow_headers=["*"], allow_credentials="*" not in settings.cors_origins)
    app.add_middleware(RequestGuard, bind_host=settings.host, cors_origins=settings.cors_origins)
    return app


def _model_card(state: ServerState, entry: RegistryEntry) -> dict:
    card = {"id": entry.name, "object": "model", "created": state.created, "owned_by": "portachat",
            "status": entry.state, "size_bytes": entry.size_bytes, "keep_alive": describe_keep_alive(entry.keep_alive)}
    if entry.is_adapter:  # as vLLM lists LoRA modules: the adapter's path as root, its base as parent
        card.update(root=entry.spec.path, parent=entry.spec.base)
    if entry.served is not None:
        card["max_model_len"] = entry.served.max_model_len
    if entry.error:
        card["error"] = entry.error
    return card


async def _model_field(request: Request) -> str:
    body = json_body(await request.body() or b"{}")
    name = body.get("model") if isinstance(body, dict) else None
    if not isinstance(name, str) or not name:
        raise APIError(400, _("Missing required parameter: 'model' (a name GET /v1/models lists)."),
                       param="model")
    return name


def begin_graceful_shutdown(app: FastAPI) -> None:
    """SIGTERM: refuse new requests at once; in-flight ones get the grace period, then end with "abort".

    Call from the event loop's thread; the server then finishes every response it started."""
    state: ServerState = app.state.server
    state.accepting = False
    engines = state.engines()
    for engine in engines:
        engine.stop_accepting()
    loop = asyncio.get_running_loop()

    async def cut_off() -> None:
        for engine in engines:
            if not await engine.drain(state.settings.shutdown_grace_s):
                engine.abort_all()

    app.state.shutdown_task = loop.create_task(cut_off())
