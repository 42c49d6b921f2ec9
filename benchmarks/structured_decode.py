"""Structured-output decoding speed: tokens/s of JSON-schema-constrained replies against free replies,
same engine, same SmolLM2-135M-Instruct weights, batch 1 and batch 32, alternating rounds, medians.

The constrained replies follow a schema with one long string field, so both sides decode about the
same number of tokens; tokens/s counts the tokens each reply really produced. Printed per batch size:
free tok/s, constrained tok/s and their ratio (1.00x = masks cost nothing).

    python benchmarks/structured_decode.py [--rounds 3] [--max-tokens 64] [--threads N] [--dtype bf16]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# minLength: the string cannot close within any reply this benchmark asks for, so every constrained
# reply runs to max_tokens as the free ones do (ignore_eos). Without it most replies closed the JSON
# after 9-40 tokens and the batch drained: later steps ran with few rows, which cut tokens/s at
# batch 32 by about a third while the masks themselves cost little.
SCHEMA = {"type": "object", "properties": {"story": {"type": "string", "minLength": 4000, "maxLength": 8000}},
          "required": ["story"], "additionalProperties": False}


def tok_per_s(engine, prompts, params) -> float:
    start = time.perf_counter()
    outs = engine.generate(prompts, params)
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    from portachat.engine import SamplingParams
    from portachat.engine.oneshot import engine_for
    from portachat.engine.structured import StructuredSpec
    from portachat.model.load import load_for_inference
    from tests.smollm2 import smollm2_gguf_path

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--batches", default="1,32")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_for_inference(smollm2_gguf_path(), device="cpu",
                                dtype=torch.bfloat16 if args.dtype == "bf16" else torch.float32)
    model, tok = loaded.model.requires_grad_(False), loaded.tokenizer
    ids = tok.render_prompt([{"role": "user", "content": "Tell me a long story about a cat, as JSON."}])
    print(f"structured decode: SmolLM2 {args.dtype}, {torch.get_num_threads()} threads, {args.max_tokens} tokens, "
          f"{args.rounds} rounds (alternating, medians)")
    for batch in (int(b) for b in args.batches.split(",")):
        engine = engine_for(model, tok, max_num_seqs=batch, max_model_len=512)
        prompts = [ids] * batch
        free = [SamplingParams(max_tokens=args.max_tokens, temperature=0.8, seed=i, ignore_eos=True)
                for i in range(batch)]
        constrained = [SamplingParams(max_tokens=args.max_tokens, temperature=0.8, seed=i,
                                      structured=StructuredSpec("json", SCHEMA)) for i in range(batch)]
        engine.prepare_structured()
        tok_per_s(engine, prompts[:1], constrained[:1])  # warm-up: grammar compiled, caches filled
        rates: dict[str, list[float]] = {"free": [], "constrained": []}
        for _round in range(args.rounds):
            rates["free"].append(tok_per_s(engine, prompts, free))
            rates["constrained"].append(tok_per_s(engine, prompts, constrained))
        f, c = statistics.median(rates["free"]), statistics.median(rates["constrained"])
        print(f"batch {batch:>3}: free {f:8.1f} tok/s   constrained {c:8.1f} tok/s   ratio {c / f:.2f}x "
              f"(cost {max(0.0, 1 - c / f):.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
