"""Helpers for tests that run `portachat serve -tp N [-dp D]` as a real process with its workers.

(A uniquely named module, not a conftest, like api_testing.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import psutil
import pytest
from api_testing import wait_healthy

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
from hf_families import make_hf_dir  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
WORKER_MODULE = "portachat.engine.workers.worker"


def tiny_llama(directory: Path) -> Path:
    """A tiny random Llama directory (4 heads over 2 kv heads: splits over 2 ranks) with a 1024 context."""
    make_hf_dir(directory, "llama", max_position_embeddings=1024)
    return directory


def serve_process(model: Path, port: int, tp: int = 2, dp: int = 1, **env_vars: str) -> subprocess.Popen:
    """The server on the CPU in fp32, its own session (the tests signal its whole process group)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **env_vars}
    parallel = ["-tp", str(tp)] + (["-dp", str(dp)] if dp > 1 else [])
    return subprocess.Popen(
        [sys.executable, "-m", "portachat", "serve", "--model", str(model), "--port", str(port), *parallel,
         "--device", "cpu", "--dtype", "fp32", "--max-model-len", "1024", "--kv-cache-gb", "0.05",
         "--shutdown-timeout", "2", "--log-level", "warning"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip


def wait_up(proc: subprocess.Popen, url: str, timeout_s: float = 120) -> None:
    try:
        wait_healthy(url, timeout_s=timeout_s)
    except TimeoutError:
        proc.kill()
        pytest.fail(f"the server did not come up: {proc.communicate()[1][-3000:]}")


def worker_pids(proc: subprocess.Popen) -> list[int]:
    """The server's tensor-parallel worker processes (every child must be one)."""
    children = psutil.Process(proc.pid).children(recursive=True)
    assert all(WORKER_MODULE in " ".join(c.cmdline()) for c in children), [c.cmdline() for c in children]
    return [c.pid for c in children]


def left_running(marker: str) -> list[str]:
    """Processes whose command line names `marker` (the test's model path), from a process listing."""
    out = subprocess.run(["ps", "-eo", "pid,stat,args"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines()[1:] if marker in line and " Z" not in line]


def assert_failed_within(chunks, url: str, killed: float, limit_s: float = 10) -> None:
    """A worker was stopped at `killed` (monotonic): the running stream fails with the OpenAI error
    shape and /health turns 503, both within `limit_s`."""
    with pytest.raises(openai.APIError, match="A distributed peer process died"):
        for _ in chunks:
            assert time.monotonic() - killed < limit_s, "the stream went on after its worker died"
    assert time.monotonic() - killed < limit_s
    health = None
    while time.monotonic() - killed < limit_s and health != 503:
        try:
            health = httpx.get(f"{url}/health", timeout=2).status_code
        except httpx.TransportError:
            break
        time.sleep(0.05)
    assert health == 503
