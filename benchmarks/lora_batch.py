"""Many LoRA adapters in one batch vs one adapter at a time, each merged into its own weights.

The workload: K adapters, R requests for each, all greedy, all arriving at once. The peer is what a
server does when it cannot batch different adapters (llama-server) or keeps a merged copy per
adapter: it runs each adapter's R requests together on that adapter's merged model, one adapter
after another. portachat runs all K x R requests in one engine, each row applying its own adapter
(grouped low-rank products over shared base weights). Also shown: the same K x R requests on the
base model alone, so the cost of the low-rank products is visible.

    python benchmarks/lora_batch.py                     # SmolLM2-135M-Instruct (the GGUF test model) if found
    python benchmarks/lora_batch.py --model PATH --adapters 4 --requests-per-adapter 8 --rank 16
    python benchmarks/lora_batch.py --depth 2 --new-tokens 8 --rounds 1 --threads 1 --json   # a smoke run

Adapters are random PEFT adapters written to a temp directory (rank --rank, every linear layer), so
each one changes the output; the script checks that both sides produce the same tokens.
Rounds alternate (ours, peer, base, base, peer, ours, ...) so background load hits every side alike;
the median of the rounds is reported. Ratios above 1.00x mean portachat is faster.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from portachat.device import get_device
from portachat.engine import EngineConfig, LLMEngine, SamplingParams
from portachat.model import GPT, GPTConfig
from portachat.model.lora import load_lora, merge_into

REPO = Path(__file__).resolve().parent.parent


def find_smollm2() -> Path | None:
    sys.path.insert(0, str(REPO / "tests"))
    from smollm2 import find_smollm2_gguf

    return find_smollm2_gguf()


def base_model(args: argparse.Namespace) -> tuple[GPT, str]:
    path = args.model or (None if args.depth else find_smollm2())
    if path is not None:
        from portachat.model.load import load_for_inference

        return load_for_inference(path, device="cpu", dtype=torch.float32).model, str(path)
    depth = args.depth or 4
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=4096, n_layer=depth, n_embd=256, n_head=4, n_kv_head=2, head_dim=64,
                          intermediate_size=768, max_seq_len=512))
    return model, f"random GPT depth {depth}"


def write_adapters(root: Path, model: GPT, count: int, rank: int) -> list[Path]:
    sys.path.insert(0, str(REPO))
    from tests.lora_files import write_random_adapter

    # std so that B A x is a few percent of W x: the adapters matter without derailing the model
    return [write_random_adapter(root / f"adapter{i}", model, rank=rank, alpha=2 * rank, seed=i, std=0.05)
            for i in range(count)]


def engine(model: GPT, num_seqs: int, length: int) -> LLMEngine:
    config = EngineConfig(dtype="fp32", compile=False, max_num_seqs=num_seqs, max_model_len=length, block_size=16,
                          num_blocks=num_seqs * -(-length // 16) + 1, enable_prefix_caching=False,
                          max_num_batched_tokens=max(256, num_seqs * 8))
    return LLMEngine(model.requires_grad_(False), tokenizer=_ids_only(model), config=config, device=get_device("cpu"))


def _ids_only(model: GPT):
    from portachat.engine.oneshot import TokenIdsOnly

    return TokenIdsOnly(model.config.vocab_size)


def timed(fn) -> tuple[float, list]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="a model path (default: SmolLM2-135M-Instruct if installed)")
    p.add_argument("--depth", type=int, default=None, help="use a random GPT of this depth instead")
    p.add_argument("--adapters", type=int, default=4)
    p.add_argument("--requests-per-adapter", type=int, default=8)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", action="store_true", help="also print one JSON line with the results")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model, described = base_model(args)
    K, R = args.adapters, args.requests_per_adapter
    length = args.prompt_len + args.new_tokens
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, model.config.vocab_size, (args.prompt_len,), generator=g).tolist() for _ in range(K * R)]
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_adapters(Path(tmp), model, K, args.rank)
        loras = [load_lora(path) for path in paths]
    names = [f"adapter{i}" for i in range(K)]

    batched = engine(copy.deepcopy(model), K * R, length)
    for name, lora in zip(names, loras, strict=True):
        batched.add_adapter(name, lora)
    merged = [engine(merge_into(copy.deepcopy(model), lora), R, length) for lora in loras]
    base = engine(copy.deepcopy(model), K * R, length)

    def params(adapter: str | None) -> SamplingParams:
        return SamplingParams(max_tokens=args.new_tokens, temperature=0.0, ignore_eos=True, adapter=adapter)

    def run_ours() -> list:
        return batched.generate(prompts, [params(names[i // R]) for i in range(K * R)])

    def run_peer() -> list:  # one adapter after another, each on its merged copy
        return [c for i, e in enumerate(merged) for c in e.generate(prompts[i * R : (i + 1) * R], params(None))]

    def run_base() -> list:
        return base.generate(prompts, params(None))

    sides = {"ours": run_ours, "merged_one_at_a_time": run_peer, "base_only": run_base}
    times: dict[str, list[float]] = {k: [] for k in sides}
    outputs: dict[str, list] = {}
    for fn in sides.values():  # warm-up (allocations, first kernels)
        fn()
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for key in order:
            seconds, outputs[key] = timed(sides[key])
            times[key].append(seconds)
    tokens = K * R * args.new_tokens
    results = {k: {"seconds": statistics.median(v), "tok_per_s": tokens / statistics.median(v)} for k, v in times.items()}
    same = sum(a.token_ids == b.token_ids for a, b in zip(outputs["ours"], outputs["merged_one_at_a_time"], strict=True))
    ratio = results["ours"]["tok_per_s"] / results["merged_one_at_a_time"]["tok_per_s"]
    overhead = results["ours"]["tok_per_s"] / results["base_only"]["tok_per_s"]
    print(f"model: {described}; {K} adapters (rank {args.rank}) x {R} requests, prompt {args.prompt_len}, "
          f"{args.new_tokens} new tokens, fp32 on {torch.get_num_threads()} CPU threads")
    for key, r in results.items():
        print(f"  {key:22s} {r['tok_per_s']:9.1f} tok/s  ({r['seconds']:.2f} s)")
    print(f"greedy outputs equal to the merged models': {same}/{K * R}")
    print(f"ratio (batched adapters / merged one at a time, tok/s): {ratio:.2f}x")
    print(f"ratio (batched adapters / base model alone, tok/s): {overhead:.2f}x")
    if args.json:
        print(json.dumps({"results": results, "ratio": ratio, "vs_base": overhead, "equal_outputs": same,
                          "requests": K * R, "model": described}))
    return 0 if same == K * R else 1


if __name__ == "__main__":
    sys.exit(main())
