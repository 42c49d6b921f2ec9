"""Tensor parallelism's LM head on CPU: replicated (every rank computes all logits) against
vocab-parallel (each rank a 1/N slice of the vocabulary, then an all-gather of the logits).

This is the choice issue 14 leaves to measurement. Two gloo processes (`torch.multiprocessing`,
one thread each, as `-tp 2` workers run on a 2-core CPU) time the head of a decode step for a given
batch: the replicated product, and the sliced product plus the all-gather, alternating, medians.
Printed per batch: milliseconds of both and replicated / vocab-parallel (above 1.00x: the split is
faster), and the head's bytes per rank each way.

    python benchmarks/tp_lm_head.py                          # SmolLM2's head: 49152 x 576, fp32
    python benchmarks/tp_lm_head.py --vocab 151936 --hidden 896 --batches 1,8,32
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    g = torch.Generator().manual_seed(0)
    head = torch.randn(args.vocab, args.hidden, generator=g) * 0.02
    rows = -(-args.vocab // world)
    part = head[rank * rows : (rank + 1) * rows].contiguous()
    part = torch.nn.functional.pad(part, (0, 0, 0, rows - part.size(0)))  # equal slices for all_gather
    results = {}
    for batch in args.batches:
        x = torch.randn(batch, args.hidden, generator=g)
        slices = [torch.empty(batch, rows) for _ in range(world)]

        def replicated(x: torch.Tensor = x) -> torch.Tensor:
            return torch.nn.functional.linear(x, head)

        def vocab_parallel(x: torch.Tensor = x, slices: list[torch.Tensor] = slices) -> torch.Tensor:
            dist.all_gather(slices, torch.nn.functional.linear(x, part))
            return torch.cat(slices, dim=-1)[:, : args.vocab]

        assert torch.allclose(replicated(), vocab_parallel(), atol=1e-4)
        times: dict[str, list[float]] = {"replicated": [], "vocab_parallel": []}
        for r in range(args.rounds):
            order = (replicated, vocab_parallel) if r % 2 == 0 else (vocab_parallel, replicated)
            for fn in order:
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    fn()
                dist.barrier()
                times[fn.__name__].append((time.perf_counter() - t0) / args.steps)
        results[batch] = {k: statistics.median(v) for k, v in times.items()}
    if rank == 0:
        out.put(results)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=49152, help="vocabulary rows (default SmolLM2's 49152)")
    p.add_argument("--hidden", type=int, default=576, help="hidden size (default SmolLM2's 576)")
    p.add_argument("--batches", default="1,8,32", help="decode batch sizes, comma-separated")
    p.add_argument("--world", type=int, default=2, help="tensor-parallel ranks (gloo processes)")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds; medians count")
    p.add_argument("--steps", type=int, default=10, help="head products per timed round")
    p.add_argument("--port", type=int, default=29533)
    args = p.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    load = os.getloadavg()[0]
    print(f"LM head {args.vocab} x {args.hidden} fp32, {args.world} gloo ranks x 1 thread, load {load:.2f} "
          f"on {os.cpu_count()} cores", flush=True)  # fmt: skip
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, args.world, args.port, args, out)) for r in range(args.world)]
    for proc in procs:
        proc.start()
    results = out.get(timeout=600)
    for proc in procs:
        proc.join()
    full = args.vocab * args.hidden * 4
    print(f"head bytes per rank: replicated {full / 2**20:.1f} MiB, vocab-parallel {full / args.world / 2**20:.1f} MiB")
    for batch, r in results.items():
        print(f"batch {batch:3d}: replicated {r['replicated'] * 1e3:7.2f} ms   vocab-parallel "
              f"{r['vocab_parallel'] * 1e3:7.2f} ms   replicated / vocab-parallel {r['replicated'] / r['vocab_parallel']:.2f}x")  # fmt: skip
    return 0 if all(p.exitcode == 0 for p in procs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
