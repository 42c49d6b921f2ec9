"""What the server holds: its settings, the model registry, the metrics; and the lease a request
holds on the model it uses."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from portachat.engine.async_engine import AsyncEngine
from portachat.engine.embeddings import Embedder
from portachat.engine.embeddings.queue import EmbeddingQueue
from portachat.engine.served import ServedModel
from portachat.engine.workers import DataParallelEngine
from portachat.i18n import _
from portachat.serve.api.errors import APIError
from portachat.serve.api.limits import admin_key_message
from portachat.serve.api.metrics import ServerMetrics
from portachat.serve.registry import ModelRegistry, RegistryEntry, parse_keep_alive
from portachat.serve.registry.keep_alive import keeps_longer
from portachat.serve.registry.registry import LoadFailed, NoRoom, UnknownModel


@dataclass
class ServerSettings:
    served_model_name: str = "portachat"  # the default model: requests that name none get it
    api_keys: list[str] = field(default_factory=list)  # any of them opens the API; none: the API is open
    admin_api_key: str | None = None  # with keys, loading, unloading and pinning models need this one
    allow_unload: bool = False  # may clients unload the models given at start-up (--model)?
    host: str = "127.0.0.1"  # the address listened on: on loopback, only loopback Host headers are served
    cors_origins: list[str] = field(default_factory=list)
    max_body_bytes: int = 1_000_000
    max_upload_bytes: int = 64 * 2**20  # POST /v1/files (documents)
    max_messages: int = 512
    shutdown_grace_s: float = 10.0  # SIGTERM: in-flight requests get this long, then end with "abort"
    embedding_model: str | None = None  # document search's model (default: the first embedding model registered)
    docs_max_bytes: int = 8 * 2**30  # document store quota: uploads + chunks + vectors (--docs-max-bytes)
    docs_max_files: int = 10_000  # uploaded files kept at once (--docs-max-files)
    # A request that sets no max_tokens gets the room its prompt leaves, at most this many; None: the room
    # (vLLM's rule). `portachat generate` sets its --max-tokens here.
    max_tokens_default: int | None = None

    @property
    def has_keys(self) -> bool:
        return bool(self.api_keys or self.admin_api_key)


@dataclass
class ModelLease:
    """One request's hold on a loaded model: nothing evicts it until `release()` (idempotent)."""

    entry: RegistryEntry
    settings: ServerSettings
    metrics: ServerMetrics
    registry: ModelRegistry
    released: bool = False

    @property
    def model_name(self) -> str:
        return self.entry.name

    @property
    def model(self) -> ServedModel:
        return self.entry.served

    @property
    def adapter(self) -> str | None:
        """The LoRA adapter the request runs with (its registry name), None for a model itself."""
        return self.entry.name if self.entry.is_adapter else None

    @property
    def engine(self) -> AsyncEngine | DataParallelEngine:
        assert self.entry.engine is not None
        return self.entry.engine

    @property
    def embedder(self) -> Embedder | None:
        return self.entry.served.embedder

    @property
    def embedding_queue(self) -> EmbeddingQueue | None:
        return self.entry.embedding_queue

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.registry.release(self.entry)
    failure: Callable[[], str | None] | None = None  # why the model can no longer run (a dead worker)
    close: Callable[[], None] | None = None  # stops what the model runs on (worker processes)
    worker_pids: list[int] = field(default_factory=list)


def model_failure(served: ServedModel | None) -> str | None:
    """Why a loaded model can no longer run (a tensor-parallel worker died), else None."""
    check = served.failure if served is not None else None
    return check() if check is not None else None


class ServerState:
    def __init__(self, settings: ServerSettings, registry: ModelRegistry, metrics: ServerMetrics) -> None:
        self.settings = settings
        self.registry = registry
        self.metrics = metrics
        self.load_error: str | None = None  # a start-up (--model) load that failed
        self.starting = True  # start-up loads still running
        self.accepting = True  # False once shutdown began: no new requests, no new loads
        self.created = 0

    @property
    def model_name(self) -> str:
        return self.settings.served_model_name

    def health(self) -> tuple[int, dict]:
        if self.load_error is not None:
            return 503, {"status": "error", "error": self.load_error}
        if self.starting:
            return 503, {"status": "loading"}
        dead = [e.name for e in self.registry.loaded() if e.engine is not None and not e.engine.is_alive]
        if dead:
            return 503, {"status": "error", "error": _("the engine of {names} has stopped").format(names=", ".join(dead))}
        failed = [f"{e.name}: {why}" for e in self.registry.loaded() if (why := model_failure(e.served))]
        if failed:
            return 503, {"status": "error", "error": "; ".join(failed)}
        return 200, {"status": "ok"}

    def require_ready(self) -> None:
        """503 while start-up loads run or after one failed (requests would only queue behind them)."""
        if self.load_error is not None:
            raise APIError(503, _("The model failed to load: {load_error}").format(load_error=self.load_error),
                           code="model_load_failed")
        if self.starting:
            raise APIError(503, _("The model is still loading: retry in a few seconds (GET /health answers "
                                  "200 once it is ready)."), code="model_loading")

    def resolve(self, name: str | None) -> str:
        """The registry name a request's `model` means; no name means the default model."""
        names = self.registry.names()
        if name in names:
            return name
        if not name and names:
            return self.model_name if self.model_name in names else names[0]
        served = ", ".join(repr(n) for n in names) or _("no models (is --models-dir empty?)")
        raise APIError(404, _("The model '{name}' does not exist on this server: it serves {served} (GET "
                              "/v1/models lists them).").format(name=name, served=served),
                       param="model", code="model_not_found")

    async def acquire(self, name: str | None, keep_alive: Any = None, generation: bool = True,
                      admin: bool = False) -> ModelLease:
        """The model a request names, loaded (waiting for its load if needed), held until released.
        With `generation`, an embedding model (no engine) is a 400. `admin`: the request used the admin
        key (or the server has no keys), which a keep_alive other than the default needs."""
        self.require_ready()
        if not self.accepting:
            raise APIError(503, _("The server is shutting down and takes no new requests. Retry against "
                                  "another replica or after the restart."), code="shutting_down")
        resolved = self.resolve(name)
        seconds = self._keep_alive(resolved, keep_alive, admin)
        try:
            entry = await self.registry.acquire(resolved, seconds)
        except UnknownModel:
            raise APIError(404, _("The model '{resolved}' does not exist on this server.").format(
                                  resolved=resolved), param="model",
                           code="model_not_found") from None
        except NoRoom as exc:
            raise APIError(503, f"{exc}.", code="no_room_for_model") from None
        except LoadFailed as exc:
            raise APIError(500, _("The model '{resolved}' failed to load: {exc}").format(
                                  resolved=resolved, exc=exc), code="model_load_failed") from None
        lease = ModelLease(entry, self.settings, self.metrics, self.registry)
        if entry.served.engine is None:
            if not generation:
                return lease
            lease.release()
            raise APIError(400, _("The model '{resolved}' is an embedding model: it serves POST "
                                  "/v1/embeddings only and cannot generate text. Name a chat model (GET "
                                  "/v1/models lists them).").format(resolved=resolved),
                           param="model", code="model_not_supported")
        if (why := model_failure(entry.served)) is not None:
            lease.release()
            raise APIError(503, _("The model '{resolved}' can no longer run: {why}. Restart `portachat "
                                  "serve`.").format(resolved=resolved, why=why),
                           code="worker_failed")
        if entry.engine is None or not entry.engine.is_alive:
            lease.release()
            raise APIError(503, _("The engine of '{resolved}' has stopped (the server is shutting down or "
                                  "failed): restart `portachat serve`.").format(resolved=resolved),
                           code="engine_stopped")
        return lease

    def _keep_alive(self, name: str, keep_alive: Any, admin: bool) -> float | None | Literal["default"]:
        """A request's keep_alive, for this request only. It decides for every client how long the model
        stays, so with keys it needs the admin key; one that would unload a start-up model sooner than
        the server's --keep-alive needs --allow-unload."""
        if keep_alive is None:
            return "default"
        try:
            seconds = parse_keep_alive(keep_alive)
        except ValueError as exc:
            raise APIError(400, str(exc), param="keep_alive") from None
        default = self.registry.keep_alive
        if seconds == default:
            return "default"
        if self.settings.has_keys and not admin:
            what = _("keep_alive {value!r} on '{name}'").format(value=keep_alive, name=name)
            raise APIError(403, admin_key_message(what, self.settings.admin_api_key is not None),
                           param="keep_alive",
                           code="admin_key_required")
        start_up = self.registry.get(name).spec.pinned
        if start_up and keeps_longer(default, seconds) and not self.settings.allow_unload:
            raise APIError(403, _("keep_alive {value!r} would unload '{name}' sooner than the server's --keep-alive, "
                                  "and clients may not unload the models given at start-up: leave keep_alive out, "
                                  "or restart the server with --allow-unload.").format(value=keep_alive, name=name),
                           param="keep_alive", code="unload_not_allowed")
        return seconds

    def engines(self) -> list[AsyncEngine | DataParallelEngine]:
        return [e.engine for e in self.registry.loaded() if e.engine is not None]
