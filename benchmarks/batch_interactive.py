"""Interactive latency beside bulk work: the same bulk requests sent as a /v1/batches job against
sent as plain concurrent requests (the peer: what a client without the Batch API does).

Starts `portachat serve` (as benchmarks/serve.py does), then per round, in alternating order:
  batch   upload --lines chat requests as a batch file, create the batch, and once it is in_progress
          time --interactive chat requests sent one after another; then cancel the batch;
  flood   keep --lines of the same requests in flight over HTTP (each one that finishes is sent again),
          and time the same interactive requests meanwhile; then drop them;
and once, idle: the interactive requests alone. Prints the median interactive latency of each side
and the ratios flood / batch (above 1: the batch API keeps interactive requests faster) and batch /
idle (how much a running batch costs an interactive request), the median over rounds.

    python benchmarks/batch_interactive.py                       # SmolLM2-135M-Instruct GGUF
    python benchmarks/batch_interactive.py --lines 16 --interactive 2 --max-tokens 4 --rounds 1   # smoke
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import sys
import time

import httpx
from serve import QUESTIONS, launch_server, smollm2_path, stop_server, wait_healthy

from portachat.cli import int_at_least


def chat(model: str, question: str, max_tokens: int) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": question}], "max_tokens": max_tokens,
            "temperature": 0.0, "ignore_eos": True}


async def interactive(client: httpx.AsyncClient, url: str, args: argparse.Namespace) -> list[float]:
    """Seconds per interactive request, one after another."""
    seconds = []
    for i in range(args.interactive):
        start = time.perf_counter()
        reply = await client.post(f"{url}/v1/chat/completions", timeout=args.timeout,
                                  json=chat(args.model_name, QUESTIONS[i % len(QUESTIONS)], args.max_tokens))
        reply.raise_for_status()
        seconds.append(time.perf_counter() - start)
    return seconds


async def beside_batch(client: httpx.AsyncClient, url: str, args: argparse.Namespace) -> list[float]:
    lines = [{"custom_id": f"row-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": chat(args.model_name, QUESTIONS[i % len(QUESTIONS)], args.bulk_tokens)} for i in range(args.lines)]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    file = (await client.post(f"{url}/v1/files", files={"file": ("bulk.jsonl", io.BytesIO(data))},
                              data={"purpose": "batch"})).json()
    batch = (await client.post(f"{url}/v1/batches", json={"input_file_id": file["id"], "completion_window": "24h",
                                                          "endpoint": "/v1/chat/completions"})).json()
    while (await client.get(f"{url}/v1/batches/{batch['id']}")).json()["status"] == "validating":
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.5)  # its first lines are decoding
    seconds = await interactive(client, url, args)
    status = (await client.get(f"{url}/v1/batches/{batch['id']}")).json()["status"]
    if status != "in_progress":  # the later interactive requests ran on an idle server: raise --lines
        print(f"note: the batch was {status} before the interactive requests were done; raise --lines",
              flush=True)
    await client.post(f"{url}/v1/batches/{batch['id']}/cancel")
    return seconds


async def beside_flood(client: httpx.AsyncClient, url: str, args: argparse.Namespace) -> list[float]:
    """The interactive requests while --lines bulk requests stay in flight: each one that finishes is
    replaced at once, so the bulk work lasts as long as the interactive requests do (a fixed flood would
    drain during the first interactive request, and the rest would be timed on an idle server)."""
    stop = asyncio.Event()

    async def bulk_stream(i: int) -> None:
        while not stop.is_set():
            await client.post(f"{url}/v1/chat/completions", timeout=args.timeout,
                              json=chat(args.model_name, QUESTIONS[i % len(QUESTIONS)], args.bulk_tokens))

    flood = [asyncio.ensure_future(bulk_stream(i)) for i in range(args.lines)]
    await asyncio.sleep(0.5)
    seconds = await interactive(client, url, args)
    stop.set()
    for task in flood:  # closing the connections aborts them in the engine
        task.cancel()
    await asyncio.gather(*flood, return_exceptions=True)
    return seconds


async def measure(url: str, args: argparse.Namespace) -> dict:
    limits = httpx.Limits(max_connections=args.lines + 8)
    async with httpx.AsyncClient(limits=limits, timeout=args.timeout) as client:
        await interactive(client, url, args)  # warm-up
        idle = statistics.median(await interactive(client, url, args))
        rounds = []
        for r in range(args.rounds):
            sides = ("batch", "flood") if r % 2 == 0 else ("flood", "batch")
            medians = {}
            for side in sides:
                run = beside_batch if side == "batch" else beside_flood
                medians[side] = statistics.median(await run(client, url, args))
                await asyncio.sleep(1.0)  # what was cancelled leaves the engine
            rounds.append(medians)
            print(f"round {r + 1}: interactive median {medians['batch'] * 1e3:.0f} ms beside the batch, "
                  f"{medians['flood'] * 1e3:.0f} ms beside the flood", flush=True)
    return {"idle_s": idle, "rounds": rounds,
            "ratio_flood_over_batch": statistics.median(m["flood"] / m["batch"] for m in rounds),
            "ratio_batch_over_idle": statistics.median(m["batch"] / idle for m in rounds)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model to serve (default: the SmolLM2-135M-Instruct GGUF test model)")
    p.add_argument("--model-name", default="bench")
    p.add_argument("--lines", type=int_at_least(1), default=64, help="bulk requests per side (default 64)")
    p.add_argument("--bulk-tokens", type=int_at_least(1), default=64, help="output tokens per bulk request (default 64)")
    p.add_argument("--interactive", type=int_at_least(1), default=6, help="interactive requests per side (default 6)")
    p.add_argument("--max-tokens", type=int_at_least(1), default=16, help="output tokens per interactive request")
    p.add_argument("--rounds", type=int_at_least(1), default=3)
    p.add_argument("--max-model-len", type=int_at_least(64), default=512)
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--threads", type=int_at_least(1), default=None)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--json", action="store_true", help="also print one JSON line with every figure")
    args = p.parse_args()
    args.model = args.model or smollm2_path()
    if args.model is None:
        raise SystemExit("no --model and the SmolLM2 GGUF test model is not installed")
    args.concurrency, args.quantize, args.kv_cache_gb = 32, None, None  # what launch_server reads
    proc, url, log = launch_server(args)
    try:
        wait_healthy(proc, url, log, timeout=600)
        result = asyncio.run(measure(url, args))
    finally:
        stop_server(proc)
    print(f"idle: interactive median {result['idle_s'] * 1e3:.0f} ms")
    print(f"ratio (interactive latency beside the flood / beside the batch): {result['ratio_flood_over_batch']:.2f}x")
    print(f"ratio (beside the batch / idle): {result['ratio_batch_over_idle']:.2f}x")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
