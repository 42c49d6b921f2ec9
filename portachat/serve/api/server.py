"""Running the app under uvicorn with a graceful SIGTERM / Ctrl-C.

uvicorn alone lets in-flight streams run for as long as they like, then cancels them mid-chunk when
its timeout hits. Here the first signal also tells the engine to refuse new work and, after the
grace period, to end what is left with finish_reason "abort", so every stream closes with a final
chunk and `data: [DONE]`.
"""

from __future__ import annotations

import asyncio

import uvicorn
from fastapi import FastAPI

from portachat.serve.api.app import begin_graceful_shutdown


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self.portachat_app = app
        self._loop: asyncio.AbstractEventLoop | None = None
        self.failed = False

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig, frame) -> None:
        if not self.should_exit and self._loop is not None:
            self._loop.call_soon_threadsafe(begin_graceful_shutdown, self.portachat_app)
        super().handle_exit(sig, frame)

    def stop(self, failed: bool = False) -> None:
        """Ask the server to exit (thread-safe), e.g. when the model failed to load."""
        self.failed = self.failed or failed
        self.should_exit = True


def make_server(app: FastAPI, host: str, port: int, grace_s: float, log_level: str = "info") -> GracefulServer:
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        # Backstop only: the engine ends every stream at grace_s, so the server is idle before this.
        timeout_graceful_shutdown=int(grace_s) + 5,
        access_log=log_level == "debug",
    )
    return GracefulServer(config, app)
