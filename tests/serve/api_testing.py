"""Real parts for the server tests: our trained BPE tokenizer behind the ChatTokenizer protocol, a tiny
random GPT in the real engine, and a real uvicorn server on a free loopback port.

(A uniquely named module, not a conftest: tests/engine has its own helpers.)
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import torch

from portachat.device import get_device
from portachat.engine import EngineConfig, LLMEngine, SamplingParams
from portachat.model import GPT, GPTConfig
from portachat.serve.api import ServedModel, ServerSettings, create_app
from portachat.serve.api.local import local_app
from portachat.serve.batch import BatchSummary, generate_file, read_input
from portachat.tokenizer.bpe import Tokenizer
from portachat.tokenizer.chat_tokenizer import PortachatChatTokenizer
from tests.serve.threaded_server import RunningServer, serve_in_thread


def chat_tokenizer(tok: Tokenizer) -> PortachatChatTokenizer:
    return PortachatChatTokenizer(tok)


def tiny_model(vocab_size: int, seed: int = 0, max_seq_len: int = 256) -> GPT:
    """Depth 2, width 64, every weight random so that replies vary with the prompt."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=vocab_size, n_layer=2, n_embd=64, n_head=4, n_kv_head=2, head_dim=16,
                          intermediate_size=128, max_seq_len=max_seq_len))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.5 + (1.0 if p.dim() == 1 else 0.0))
    return model.eval()


def served_tiny(tokenizer, max_model_len: int = 256, model: GPT | None = None, **engine: Any) -> ServedModel:
    config = dict(dtype="fp32", compile=False, max_model_len=max_model_len, block_size=16,
                  num_blocks=4 * max_model_len // 16 + 8, max_num_seqs=8, max_num_batched_tokens=256)
    config.update(engine)
    model = model or tiny_model(tokenizer.vocab_size, max_seq_len=max_model_len)
    llm = LLMEngine(model, tokenizer, EngineConfig(**config), device=get_device("cpu"))
    return ServedModel(engine=llm, tokenizer=tokenizer, max_model_len=llm.max_model_len)


def prompt_lease(tokenizer: Any, max_messages: int = 100) -> SimpleNamespace:
    """What prompt.chat_prompt (the server's prompt renderer) reads of a model lease, with no engine."""
    return SimpleNamespace(settings=SimpleNamespace(max_messages=max_messages), model=SimpleNamespace(tokenizer=tokenizer))


def run_batch(served: ServedModel, input_path: Path, output_path: Path, defaults: SamplingParams,
              max_in_flight: int = 64) -> BatchSummary:
    """`portachat generate` over a model already loaded: check `input_path`, run what `output_path` lacks."""
    app = local_app(ServerSettings(served_model_name="portachat"), lambda: served)
    return generate_file(app, read_input(input_path, app), output_path, lambda _model: defaults, max_in_flight)


def start_server(served: ServedModel, **settings: Any) -> RunningServer:
    settings.setdefault("served_model_name", "tiny")
    app = create_app(ServerSettings(**settings), loader=lambda: served)
    server = serve_in_thread(app)
    wait_healthy(server.url)
    return server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url}/health did not answer 200 within {timeout_s} s")


def metric(url: str, name: str, headers: dict | None = None) -> float:
    """The summed value of a Prometheus metric on /metrics (0 when absent)."""
    text = httpx.get(f"{url}/metrics", headers=headers, timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_idle(url: str, timeout_s: float = 10.0, headers: dict | None = None) -> None:
    """Until /metrics shows no running or waiting request and an empty KV cache."""
    deadline = time.monotonic() + timeout_s
    names = ("portachat:num_requests_running", "portachat:num_requests_waiting", "portachat:kv_cache_usage_perc")
    while time.monotonic() < deadline:
        if all(metric(url, n, headers) == 0 for n in names):
            return
        time.sleep(0.05)
    values = {n: metric(url, n, headers) for n in names}
    raise AssertionError(f"server not idle after {timeout_s} s: {values}")
