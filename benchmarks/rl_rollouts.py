"""RL rollout throughput: G replies per prompt from portachat's engine in the training process
(train.rollout: paged KV, continuous batching, the G replies sharing their prompt's blocks)
against `transformers.generate` on the same weights, as TRL's GRPOTrainer generates without vLLM
(each prompt repeated G times, left-padded, sampled in one `generate` call).

Both sides start from the model as RL trains it (fp32 master weights that require gradients). Our
engine samples from the frozen copy the device layer asks for (device.inference.rollout_engine_dtype:
on a CPU an fp32 copy, which takes the engine's fused forward, refreshed in place before each batch,
that refresh timed too); where it copies, a third side runs the engine over the training weights
themselves (the module path) to show what the copy buys. Every side samples at temperature 1 and
generates exactly `--new-tokens` tokens per reply (no stop token), in alternating timed rounds inside
this one process so background load hits all alike. Printed: rollout tokens/s of each side (new
tokens only), the ratio (ours / transformers; the goal on a CPU is >= 3x) and copy_gain (ours / ours
over the training weights).

    python benchmarks/rl_rollouts.py                       # SmolLM2-135M, 4 prompts x G=8, 64 new tokens
    python benchmarks/rl_rollouts.py --models ours --depth 4 --group 16 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from portachat.device import Device, get_device
from portachat.engine.oneshot import TokenIdsOnly
from portachat.model import GPT, GPTConfig
from portachat.train.rollout import Rollout

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode import hf_twin, load_smollm2  # noqa: E402  (the decode benchmark's loaders: one home)


def training_model(name: str, dev: Device, depth: int) -> GPT:
    """The model as an RL run holds it: fp32, trainable, in train mode."""
    if name == "smollm2":
        model = load_smollm2(dev, torch.float32)
    else:
        torch.manual_seed(0)
        model = GPT(GPTConfig.from_depth(depth, vocab_size=32768, max_seq_len=2048)).to(dev.torch_device)
    return model.float().requires_grad_(True).train()


def run_ours(rollout: Rollout, prompts: list[list[int]], group: int, new_tokens: int, dev: Device) -> float:
    dev.synchronize()
    t0 = time.perf_counter()
    replies = rollout.sample_groups(prompts, group, new_tokens, 1.0, seed=0)
    dev.synchronize()
    assert all(len(r) == new_tokens for g in replies for r in g)
    return time.perf_counter() - t0


@torch.no_grad()
def run_hf(hf, prompts: list[list[int]], group: int, new_tokens: int, dev: Device) -> float:
    rows = [p for p in prompts for _ in range(group)]  # TRL repeats each prompt G times
    width = max(len(p) for p in rows)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in rows], device=dev.torch_device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in rows], device=dev.torch_device)
    dev.synchronize()
    t0 = time.perf_counter()
    out = hf.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=True,
                      temperature=1.0, top_k=0, top_p=1.0, pad_token_id=0)
    dev.synchronize()
    assert out.shape[1] == width + new_tokens
    return time.perf_counter() - t0


def bench(name: str, args: argparse.Namespace, dev: Device) -> dict:
    model = training_model(name, dev, args.depth)
    hf = hf_twin(model, torch.float32, dev.torch_device)
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompts = [torch.randint(0, vocab, (args.prompt_len + 3 * i,), generator=g).tolist() for i in range(args.prompts)]
    rollout = Rollout(model, TokenIdsOnly(vocab), dev, max_num_seqs=args.prompts * args.group,
                           max_model_len=max(len(p) for p in prompts) + args.new_tokens)
    in_place = Rollout(model, TokenIdsOnly(vocab), dev, max_num_seqs=args.prompts * args.group,
                            max_model_len=max(len(p) for p in prompts) + args.new_tokens, copy=False)
    sides = {"ours": (run_ours, rollout), "hf": (run_hf, hf)}
    if rollout.engine().model is not model:  # the device copies: also time the engine over the training weights
        sides["in_place"] = (run_ours, in_place)
    for fn, runner in sides.values():  # warm up
        fn(runner, prompts, args.group, 2, dev)
    times: dict[str, list[float]] = {k: [] for k in sides}
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for side in order:
            fn, runner = sides[side]
            times[side].append(fn(runner, prompts, args.group, args.new_tokens, dev))
    tokens = args.prompts * args.group * args.new_tokens
    tok_s = {k: tokens / statistics.median(v) for k, v in times.items()}
    rec = dict(model=name, prompts=args.prompts, group=args.group, new_tokens=args.new_tokens,
               ours_tok_s=tok_s["ours"], hf_tok_s=tok_s["hf"], ratio=tok_s["ours"] / tok_s["hf"],
               prefix_hits=rollout.engine().blocks.prefix_hits, fused=rollout.engine().runner.packed is not None)
    gain = ""
    if "in_place" in tok_s:
        rec.update(in_place_tok_s=tok_s["in_place"], copy_gain=tok_s["ours"] / tok_s["in_place"])
        gain = f"   (over the training weights {tok_s['in_place']:8.1f} tok/s: copy gain {rec['copy_gain']:.2f}x)"
    print(f"{name:>8}  {args.prompts} prompts x G={args.group}, {args.new_tokens} new tokens: ours "
          f"{tok_s['ours']:8.1f} tok/s   transformers.generate {tok_s['hf']:8.1f} tok/s   ratio {rec['ratio']:.2f}x"
          + gain, flush=True)
    return rec


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="smollm2", help="comma list of: smollm2, ours (a random model of --depth)")
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group", type=int, default=8, help="replies per prompt, G")
    p.add_argument("--prompt-len", type=int, default=96)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3, help="timed runs per side, alternating; the median counts")
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: auto)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's choice)")
    p.add_argument("--json", action="store_true", help="print one JSON record as the last line")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = get_device(args.device, dtype="fp32", compile=False)
    records = [bench(name, args, dev) for name in args.models.split(",") if name]
    if args.json:
        print(json.dumps({"device": dev.type, "results": records}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
