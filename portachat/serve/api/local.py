"""The server's routes without HTTP: one model, the state the routes read, and nothing else (no
listening socket, no document or batch store opened, no batch jobs resumed). `portachat generate`
runs each of its lines here through the very handler the server would (batch_lines.run_line)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from starlette.datastructures import State

from portachat.engine.served import ServedModel
from portachat.serve.api.app import single_model_registry
from portachat.serve.api.metrics import ServerMetrics
from portachat.serve.api.state import ServerSettings, ServerState
from portachat.serve.registry.registry import LoadFailed

# Who a local line runs as: the owner of a server without API keys, allowed what the admin may
# (a line's keep_alive) — the user who runs the command owns the model it loads.
LOCAL_OWNER = ""


@dataclass
class LocalApp:
    """What a route handler reaches through `request.app`: `state.server` (and `state.doc_store` once
    a line asks for documents)."""

    state: State = field(default_factory=State)

    @property
    def server(self) -> ServerState:
        return self.state.server


def local_app(settings: ServerSettings, loader: Callable[[], ServedModel]) -> LocalApp:
    """An app for the one model `loader` makes, named `settings.served_model_name`; not loaded yet
    (its lines can be checked first: batch_lines.read_lines needs only the name)."""
    name = settings.served_model_name
    app = LocalApp()
    app.state.server = ServerState(settings, single_model_registry(name, loader), ServerMetrics(name))
    return app


@contextlib.asynccontextmanager
async def running(app: LocalApp) -> AsyncIterator[LocalApp]:
    """The model loaded and its engine running for the body of the `async with`; then stopped (lines
    still running end with "abort") and the engine thread joined, as a server's shutdown does."""
    server = app.server
    try:
        await server.registry.load(server.model_name)
    except LoadFailed as exc:  # the loader's own error, which a command reports as its load failing
        raise (exc.__cause__ or exc) from None
    finally:
        server.starting = False
    try:
        yield app
    finally:
        server.accepting = False
        for engine in server.engines():
            engine.stop_accepting()
            engine.abort_all()
        await server.registry.shutdown()
