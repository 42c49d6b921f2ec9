"""Muon's step with Newton-Schulz split across data-parallel ranks vs every rank doing all of it.

Starts `--nproc` processes (gloo on CPU, the device's collective elsewhere), gives each the same
hidden matrices as a GPT of `--depth` (the Muon group of the real model) and the same gradients,
and times Muon.step with `split_across_ranks=True` (ours: each rank orthogonalises a 1/world share,
then an all-gather) against `split_across_ranks=False` (the peer: the same optimizer, every rank
repeating every matrix), in alternating blocks inside the same processes. The ratio printed is
peer / ours median step time: above 1.00x the split saves time.

    python benchmarks/muon_split.py --nproc 2 --depth 4
    python benchmarks/muon_split.py --nproc 8 --depth 20        # on an 8-device machine
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time

import torch
import torch.multiprocessing as mp
from alternate import alternating_medians  # benchmarks/ is on sys.path when run as a script


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, args: argparse.Namespace, port: int, results) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(args.nproc),
                      LOCAL_WORLD_SIZE=str(args.nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(args.threads)
    import torch.distributed as dist

    from portachat.device import destroy_distributed, get_device, init_distributed
    from portachat.model import GPT, GPTConfig
    from portachat.train.optim import Muon

    dev = get_device(args.device)
    init_distributed(dev)
    cfg = GPTConfig.from_depth(args.depth, vocab_size=256, max_seq_len=64)
    with torch.device("meta"):
        shapes = [tuple(p.shape) for p in GPT(cfg).param_groups()["matrix"]]
    g = torch.Generator().manual_seed(0)
    ns_dtype = torch.bfloat16 if dev.dtype == torch.bfloat16 else torch.float32

    def make(split: bool):
        params = [torch.nn.Parameter(torch.randn(s, generator=g).to(dev.torch_device)) for s in shapes]
        for p in params:
            p.grad = torch.randn(p.shape, generator=g).to(dev.torch_device)
        return Muon(params, lr=0.01, ns_dtype=ns_dtype, split_across_ranks=split)

    sides = {"ours": make(True), "peer": make(False)}
    def timed(name: str) -> float:
        dev.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        sides[name].step()
        dev.synchronize()
        dist.barrier()  # a step is over when the slowest rank is done
        return time.perf_counter() - t0

    medians = alternating_medians(timed, args.warmup, args.steps)
    if rank == 0:
        results["ours_ms"] = 1e3 * medians["ours"]
        results["peer_ms"] = 1e3 * medians["peer"]
        results["matrices"] = len(shapes)
        results["device"] = dev.kind
    destroy_distributed()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=2, help="processes (one per device); default 2")
    ap.add_argument("--depth", type=int, default=4, help="GPT depth whose hidden matrices are stepped (default 4)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per side (default 10)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per side (default 2)")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads per process (default 1)")
    ap.add_argument("--device", default=None, help="cpu|cuda|... (default: auto-detect)")
    ap.add_argument("--json", action="store_true", help="also print one JSON line")
    args = ap.parse_args()
    results = mp.Manager().dict()
    mp.spawn(_worker, args=(args, _free_port(), results), nprocs=args.nproc, join=True)
    r = dict(results)
    ratio = r["peer_ms"] / r["ours_ms"]
    print(f"Muon step, depth {args.depth} ({r['matrices']} matrices), {args.nproc} processes on {r['device']}")
    print(f"  split across ranks (ours): {r['ours_ms']:.2f} ms   every rank all matrices (peer): {r['peer_ms']:.2f} ms")
    print(f"ratio (peer / ours step time): {ratio:.2f}x")
    if args.json:
        print(json.dumps({"nproc": args.nproc, "depth": args.depth, **r, "ratio": ratio}))


if __name__ == "__main__":
    main()
