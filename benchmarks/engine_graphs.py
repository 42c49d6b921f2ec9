"""The engine's decode graphs against eager decoding, and two engines generating from two threads at once.

1. Greedy replies with decode graphs (the device policy) and with `enforce_eager`, same weights and
   prompts: fp32 must agree token for token; in the device's inference dtype (bf16 on GPUs) a
   different kernel order may flip a near-tie, so the first position where they part is reported.
2. Two engines over their own copies of the model, each in its own thread, generating at the same
   time (data-parallel replicas and models served together do this): both must finish, give the
   replies they give alone, and still replay their graphs afterwards.

    python benchmarks/engine_graphs.py --depth 12 --json          # on a GPU
    python benchmarks/engine_graphs.py --depth 2 --device cpu     # the structure, on a CPU
"""

from __future__ import annotations

import argparse
import copy
import json
import threading

import torch

from portachat.device import Device, get_device
from portachat.engine import EngineConfig, LLMEngine, SamplingParams
from portachat.engine.oneshot import TokenIdsOnly
from portachat.model import GPT, GPTConfig
from portachat.ops.inference_dtype import inference_dtype


def make_engine(model: GPT, args: argparse.Namespace, dev: Device, eager: bool, share: float) -> LLMEngine:
    config = EngineConfig(max_model_len=args.prompt_len + args.new_tokens + 8, max_num_seqs=args.batch,
                          max_num_batched_tokens=max(512, args.batch * args.prompt_len), dtype="model",
                          enforce_eager=eager, gpu_memory_utilization=share, enable_prefix_caching=False)
    return LLMEngine(model, TokenIdsOnly(model.config.vocab_size), config, device=dev)


def greedy(engine: LLMEngine, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    return [list(c.token_ids) for c in engine.generate(prompts, params)]


def first_divergence(a: list[list[int]], b: list[list[int]]) -> dict | None:
    """The earliest (sequence, position) where two sets of replies differ, or None."""
    best = None
    for seq, (x, y) in enumerate(zip(a, b, strict=True)):
        pos = next((i for i, (s, t) in enumerate(zip(x, y, strict=False)) if s != t), None)
        if pos is None and len(x) != len(y):
            pos = min(len(x), len(y))
        if pos is not None and (best is None or pos < best["position"]):
            best = {"sequence": seq, "position": pos}
    return best


def graphs_vs_eager(model: GPT, dtype: torch.dtype, prompts: list[list[int]], args: argparse.Namespace,
                    dev: Device) -> dict:  # fmt: skip
    twin = copy.deepcopy(model).to(dtype)
    graphs = make_engine(twin, args, dev, eager=False, share=0.4)
    with_graphs = greedy(graphs, prompts, args.new_tokens)
    used = graphs.uses_decode_graphs
    reason = graphs.graphs_reason
    del graphs
    eager = greedy(make_engine(twin, args, dev, eager=True, share=0.4), prompts, args.new_tokens)
    where = first_divergence(with_graphs, eager)
    return {"dtype": str(dtype).removeprefix("torch."), "graphs_used": used, "graphs_reason": reason,
            "identical": where is None, "first_divergence": where}


def two_threads(model: GPT, prompts: list[list[int]], args: argparse.Namespace, dev: Device) -> dict:
    engines = [make_engine(copy.deepcopy(model), args, dev, eager=False, share=0.3) for _ in range(2)]
    alone = [greedy(e, prompts, args.new_tokens) for e in engines]
    graphs_alone = [e.uses_decode_graphs for e in engines]
    results: list[list[list[int]] | None] = [None, None]
    errors: list[str] = []
    start = threading.Barrier(2)

    def work(i: int) -> None:
        try:
            start.wait()
            results[i] = greedy(engines[i], prompts, args.new_tokens)
        except Exception as exc:  # the finding, not a crash
            errors.append(f"engine {i}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    same = [results[i] == alone[i] for i in range(2)]
    graphs = [e.uses_decode_graphs for e in engines]  # a capture broken by the other thread falls back to eager
    return {"ok": not errors and all(same) and graphs == graphs_alone, "errors": errors, "same_as_alone": same,
            "graphs_alone": graphs_alone, "graphs_after": graphs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--depth", type=int, default=12, help="depth of the randomly initialised model")
    p.add_argument("--batch", type=int, default=8, help="sequences generated together")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--device", default=None, help="cpu, cuda, npu, ... (default: auto)")
    p.add_argument("--json", action="store_true", help="print one JSON record as the last line")
    args = p.parse_args(argv)
    dev = get_device(args.device)
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_depth(args.depth, vocab_size=32768, max_seq_len=2048))
    model = model.to(dev.torch_device).eval().requires_grad_(False)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, model.config.vocab_size, (args.batch, args.prompt_len), generator=g).tolist()
    record: dict = {"device": dev.name, "kind": dev.kind, "depth": args.depth, "batch": args.batch}
    with torch.inference_mode():
        dtypes = [torch.float32] + [d for d in (inference_dtype(dev).value,) if d != torch.float32]
        record["graphs_vs_eager"] = [graphs_vs_eager(model, d, prompts, args, dev) for d in dtypes]
        for r in record["graphs_vs_eager"]:
            where = r["first_divergence"]
            print(f"graphs {'on' if r['graphs_used'] else 'off'} ({r['graphs_reason']}) vs eager, {r['dtype']}: "
                  + ("identical" if where is None else f"first differ at sequence {where['sequence']}, "
                     f"token {where['position']}"), flush=True)
        record["two_threads"] = two_threads(model, prompts, args, dev)
        t = record["two_threads"]
        print(f"two engines in two threads: {'ok' if t['ok'] else 'FAILED'}; same as alone {t['same_as_alone']}, "
              f"graphs after {t['graphs_after']}" + (f"; errors: {t['errors']}" if t["errors"] else ""), flush=True)
    fp32 = record["graphs_vs_eager"][0]
    record["ok"] = fp32["identical"] and record["two_threads"]["ok"]
    if args.json:
        print(json.dumps(record))
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
