"""A real uvicorn server on a background thread for the tests: `serve_in_thread(app)`, its `url`,
then `stop()`. The product's server (`serve/api/server.py`) makes it; only tests run it this way."""

from __future__ import annotations

import threading
import time
from typing import Any

from portachat.serve.api.server import GracefulServer, make_server


class RunningServer:
    """A server on a background thread: `url`, then `stop()`."""

    def __init__(self, server: GracefulServer, thread: threading.Thread) -> None:
        self.server = server
        self.thread = thread
        host, port = server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"

    def stop(self, timeout_s: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)


def serve_in_thread(app: Any, host: str = "127.0.0.1", port: int = 0, grace_s: float = 5.0,
                    startup_timeout_s: float = 30.0) -> RunningServer:
    """Start `app` under uvicorn on a thread (port 0 = a free port) and return once it listens."""
    server = make_server(app, host, port, grace_s, log_level="warning")
    thread = threading.Thread(target=server.run, name="portachat-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the server did not start on {host}:{port}")
        time.sleep(0.01)
    return RunningServer(server, thread)
