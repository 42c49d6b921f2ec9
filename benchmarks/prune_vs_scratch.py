"""The compress and distill claims, measured: a pruned model healed by distillation for a budget of
steps, against the same pruned model healed by plain cross-entropy and against a model of the same size
trained from scratch, all for the same steps on the same tokens.

Three sides (`--sides`, default all): `distill` starts from the teacher's weights kept by Minitron
importance (portachat.compress) and learns the teacher's next-token distributions on text windows
(forward KL, the loss `compress` heals with by default: train/distill.py's DistillHook); `ce` starts
from the same pruned weights and learns the next tokens by cross-entropy (as `compress --heal sft`);
`scratch` is the same pruned config (layers, widths, heads, vocabulary), freshly initialised as
`train base` initialises (GPT.init_weights), at its own learning rate (from-scratch rates are ~10x
fine-tuning's). All train with plain AdamW on the same batches in the same order, the sides
alternating step by step so background load hits them alike; the distill side's time includes the
teacher's forward pass. Reported: held-out perplexity of teacher, pruned (before healing) and each
side, and the ratios ce / distill (above 1.00x: distillation beats cross-entropy at the same size
and budget) and scratch / distill (above 1.00x: prune + distill beats training from scratch).

The teacher is SmolLM2-135M-Instruct (default) or, with `--tiny`, a model of our own architecture
trained here on the same text with a byte-level BPE trained on it: `--teacher-depth D` sizes it as
`train base --depth D` does (GPTConfig.from_depth, the speedrun model's shape); without it a toy
config for smoke runs.

    python benchmarks/prune_vs_scratch.py                                   # SmolLM2-135M (GGUF) to 20 layers
    python benchmarks/prune_vs_scratch.py --tiny --teacher-depth 8 --teacher-steps 600 --target-num-layers 4
    python benchmarks/prune_vs_scratch.py --target-num-layers 2 --steps 2 --seq-len 32 --batch-size 2 --tiny --teacher-steps 4  # smoke
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from pathlib import Path

import torch

from portachat.compress.calibration import calibration_batches, calibration_tokens
from portachat.compress.importance import measure_importance
from portachat.compress.prune import PruneTargets, prune_model, pruned_config
from portachat.data.batch import Batch
from portachat.device import get_device
from portachat.model import GPT, GPTConfig
from portachat.tokenizer.bpe import train_tokenizer
from portachat.train.base_model import load_base
from portachat.train.distill import DistillHook
from portachat.train.distill_loss import DistillLoss
from portachat.train.teacher import InProcessTeacher

sys.path.insert(0, str(Path(__file__).resolve().parent))
from finetune_gsm8k import find_smollm2  # noqa: E402  (the benchmarks' one way to find the test model)

REPO = Path(__file__).resolve().parent.parent
TEXT = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"


@torch.no_grad()
def perplexity(model: GPT, rows: list[torch.Tensor], dev) -> float:
    model.eval()
    total = tokens = 0.0
    for idx in rows:
        idx = idx.to(dev.torch_device)
        with dev.autocast():
            total += float(model(idx[:, :-1], idx[:, 1:], loss_reduction="sum"))
        tokens += idx[:, 1:].numel()
    return math.exp(total / tokens)


def tiny_teacher(dev, vocab: int, steps: int, batches: list[torch.Tensor], depth: int | None, lr: float) -> GPT:
    """A model of our architecture trained here on the same text: `train base --depth D`'s shape, or
    (depth None) a toy config for smoke runs."""
    if depth is None:
        cfg = GPTConfig(vocab_size=vocab, n_layer=4, n_embd=64, n_head=4, n_kv_head=2, head_dim=16,
                        intermediate_size=128)
    else:
        cfg = GPTConfig.from_depth(depth, vocab_size=vocab, max_seq_len=1024, head_dim=64)
    model = GPT(cfg).to(dev.torch_device)
    model.init_weights(seed=1)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    start = time.perf_counter()
    for step in range(steps):
        idx = batches[step % len(batches)].to(dev.torch_device)
        with dev.autocast():
            loss = model(idx[:, :-1], idx[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (step + 1) % 100 == 0:
            print(f"  teacher step {step + 1}/{steps}: loss {loss.item():.3f} ({time.perf_counter() - start:.0f} s)",
                  flush=True)
    return model


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="teacher (default: SmolLM2-135M-Instruct GGUF)")
    p.add_argument("--tiny", action="store_true", help="train a teacher of our architecture here instead")
    p.add_argument("--teacher-depth", type=int, help="--tiny: the teacher's depth, sized as train base --depth "
                   "(default: a toy config for smoke runs)")
    p.add_argument("--teacher-steps", type=int, default=60, help="--tiny: steps that train the teacher")
    p.add_argument("--teacher-lr", type=float, default=3e-3, help="--tiny: the teacher's AdamW learning rate")
    p.add_argument("--vocab-size", type=int, default=2048, help="--tiny with --teacher-depth: the BPE's vocabulary")
    p.add_argument("--data", default=str(TEXT))
    p.add_argument("--target-num-layers", type=int, default=20)
    p.add_argument("--target-ffn-hidden-size", type=int)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--sides", default="distill,ce,scratch",
                   help="comma list of: distill (pruned, healed by KD), ce (pruned, healed by cross-entropy), scratch")
    p.add_argument("--lr-heal", type=float, default=1e-4)
    p.add_argument("--lr-scratch", type=float, default=1e-3)
    p.add_argument("--calibration-samples", type=int, default=32)
    p.add_argument("--eval-rows", type=int, default=32)
    p.add_argument("--device")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    dev = get_device(args.device)
    torch.manual_seed(0)

    sides = [x for x in args.sides.split(",") if x]
    if not sides or set(sides) - {"distill", "ce", "scratch"}:
        p.error(f"--sides: a comma list of distill, ce, scratch; got {args.sides!r}")
    if args.tiny:
        text = Path(args.data).read_text(encoding="utf-8")
        if args.teacher_depth is None:
            sys.path.insert(0, str(REPO))  # the tests package is not installed; CI runs from a clean clone
            from tests.model.hf_families import train_bpe  # a toy byte-level BPE, as the tests build it

            tok = train_bpe()
            vocab, ids = tok.get_vocab_size(), tok.encode(text[:200_000]).ids
        else:
            tok = train_tokenizer([text[i: i + 10_000] for i in range(0, len(text), 10_000)], args.vocab_size,
                                  verbose=False)
            vocab, ids = tok.vocab_size, tok.encode(text)
        rows = calibration_batches(ids, len(ids) // (args.seq_len + 1), args.seq_len)
        # The teacher trains on the windows the students train on; the held-out windows it never sees.
        flat_rows = torch.cat(rows)
        n_eval = args.calibration_samples + args.eval_rows
        teacher_rows = list(torch.cat([flat_rows[:args.calibration_samples], flat_rows[n_eval:]]).split(args.batch_size))
        teacher = tiny_teacher(dev, vocab, args.teacher_steps, teacher_rows, args.teacher_depth, args.teacher_lr)
    else:
        spec = args.model or str(find_smollm2())
        base = load_base(spec, dev)
        teacher = base.model
        need = (args.calibration_samples + args.eval_rows + args.steps * args.batch_size) * (args.seq_len + 1)
        ids = calibration_tokens(args.data, base.tokenizer.encode, base.render, need)
        rows = calibration_batches(ids, len(ids) // (args.seq_len + 1), args.seq_len)
    flat = torch.cat(rows)
    calib = list(flat[: args.calibration_samples].split(4))
    held_out = list(flat[args.calibration_samples: args.calibration_samples + args.eval_rows].split(4))
    train = flat[args.calibration_samples + args.eval_rows:]

    teacher.requires_grad_(False)
    targets = PruneTargets(num_layers=args.target_num_layers, ffn_hidden_size=args.target_ffn_hidden_size)
    cfg: GPTConfig = pruned_config(teacher.config, targets)
    importance = measure_importance(teacher, calib)
    pruned, _plan = prune_model(teacher, importance, targets)
    pruned = pruned.float()
    results = {"teacher": perplexity(teacher, held_out, dev), "pruned": perplexity(pruned, held_out, dev)}
    models: dict[str, GPT] = {}
    for name in sides:
        if name == "scratch":
            models[name] = GPT(cfg).to(dev.torch_device)
            models[name].init_weights(seed=0)
        else:
            models[name] = copy.deepcopy(pruned).requires_grad_(True)
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=args.lr_scratch if name == "scratch" else args.lr_heal)
                  for name, m in models.items()}
    seconds = {name: 0.0 for name in sides}
    distill = DistillHook(models["distill"], InProcessTeacher(teacher, "teacher"), DistillLoss()) if "distill" in sides else None

    def step_loss(name: str, model: GPT, idx: torch.Tensor) -> torch.Tensor:
        if name == "distill":  # mean forward KL per predicted token
            return distill(model, Batch(inputs=idx[:, :-1], targets=idx[:, 1:])) / idx[:, 1:].numel()
        return model(idx[:, :-1], idx[:, 1:])

    for step in range(args.steps):
        idx = train[(step * args.batch_size) % len(train):][: args.batch_size].to(dev.torch_device)
        for name in (sides if step % 2 == 0 else list(reversed(sides))):  # alternate the order
            model, opt = models[name], optimizers[name]
            model.train()
            start = time.perf_counter()
            with dev.autocast():
                loss = step_loss(name, model, idx)
            opt.zero_grad()
            loss.backward()
            opt.step()
            dev.synchronize()
            seconds[name] += time.perf_counter() - start
    for name, model in models.items():
        results[name] = perplexity(model, held_out, dev)
    ratios = {f"{other}/distill": results[other] / results["distill"] for other in ("ce", "scratch")
              if other in models and "distill" in models}
    tokens = args.steps * args.batch_size * args.seq_len
    print(f"device {dev.type}; {teacher.config.n_layer} -> {cfg.n_layer} layers, "
          f"{sum(p.numel() for p in teacher.parameters()):,} -> {sum(p.numel() for p in pruned.parameters()):,} "
          f"parameters; budget {args.steps} steps = {tokens:,} tokens")
    for name in ("teacher", "pruned", *sides):
        extra = f"  ({seconds[name]:.1f} s training)" if name in seconds else ""
        print(f"  {name:8s} perplexity {results[name]:10.3f}{extra}")
    for name, ratio in ratios.items():
        print(f"ratio {name} perplexity: {ratio:.2f}x" + ("  (above 1: distillation wins)" if ratio > 1 else ""))
    if args.json:
        print(json.dumps({"perplexity": results, "ratios": ratios, "seconds": seconds, "steps": args.steps,
                          "tokens": tokens, "sides": sides, "layers": [teacher.config.n_layer, cfg.n_layer],
                          "parameters": [sum(p.numel() for p in teacher.parameters()),
                                         sum(p.numel() for p in pruned.parameters())]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
