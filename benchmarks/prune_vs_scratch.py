"""The compress claim, measured: a pruned model healed by distillation for a budget of steps against a
model of the same size trained from scratch for the same steps on the same tokens.

The peer is the from-scratch model: the same pruned config (layers, widths, heads, vocabulary),
freshly initialised as `train base` initialises (GPT.init_weights), trained with the same batches in
the same order, at its own learning rate (from-scratch rates are ~10x fine-tuning's). Both train with
plain AdamW over windows of a text file; the pruned side starts from the teacher's weights kept by
Minitron importance (portachat.compress) and learns the teacher's next-token distributions on those
windows (forward KL, the loss `compress` heals with by default: train/distill.py's DistillHook), the
scratch side learns the next tokens by cross-entropy. `--heal ce` heals by cross-entropy instead (as
`compress --heal sft`). The healed side's time includes the teacher's forward pass. Reported: held-out perplexity of teacher, pruned (before healing), healed and scratch; the ratio
scratch / healed perplexity (above 1.00x: prune + heal wins at this budget). The sides alternate
step by step, so background load hits both alike; training time per side is reported too.

    python benchmarks/prune_vs_scratch.py                                   # SmolLM2-135M (GGUF) to 20 layers
    python benchmarks/prune_vs_scratch.py --target-num-layers 2 --steps 2 --seq-len 32 --batch-size 2 --tiny --teacher-steps 4  # smoke
"""

from __future__ import annotations

import argparse
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
from portachat.train.distill import DistillHook
from portachat.train.distill_loss import DistillLoss
from portachat.train.finetune import load_base
from portachat.train.teacher import InProcessTeacher

REPO = Path(__file__).resolve().parent.parent
TEXT = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"


def find_smollm2() -> Path | None:
    sys.path.insert(0, str(REPO / "tests"))
    from smollm2 import find_smollm2_gguf

    return find_smollm2_gguf()


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


def tiny_teacher(dev, vocab: int, steps: int, batches: list[torch.Tensor]) -> GPT:
    """A small model trained here on the same text, standing in for a real teacher in smoke runs."""
    model = GPT(GPTConfig(vocab_size=vocab, n_layer=4, n_embd=64, n_head=4, n_kv_head=2, head_dim=16,
                          intermediate_size=128)).to(dev.torch_device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(steps):
        idx = batches[step % len(batches)].to(dev.torch_device)
        loss = model(idx[:, :-1], idx[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="teacher (default: SmolLM2-135M-Instruct GGUF)")
    p.add_argument("--tiny", action="store_true", help="train a tiny teacher here instead (smoke runs)")
    p.add_argument("--teacher-steps", type=int, default=60, help="--tiny: steps that train the tiny teacher")
    p.add_argument("--data", default=str(TEXT))
    p.add_argument("--target-num-layers", type=int, default=20)
    p.add_argument("--target-ffn-hidden-size", type=int)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--heal", choices=["distill", "ce"], default="distill",
                   help="distill from the teacher (compress's default) or cross-entropy on the text")
    p.add_argument("--lr-heal", type=float, default=1e-4)
    p.add_argument("--lr-scratch", type=float, default=1e-3)
    p.add_argument("--calibration-samples", type=int, default=32)
    p.add_argument("--eval-rows", type=int, default=32)
    p.add_argument("--device")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    dev = get_device(args.device)
    torch.manual_seed(0)

    if args.tiny:
        sys.path.insert(0, str(REPO))  # the tests package is not installed; CI runs from a clean clone
        from tests.model.hf_families import train_bpe  # a tiny byte-level BPE, as the tests build it

        tok = train_bpe()
        ids = tok.encode(Path(args.data).read_text(encoding="utf-8")[:200_000]).ids
        rows = calibration_batches(ids, args.calibration_samples + args.eval_rows + args.steps * args.batch_size,
                                   args.seq_len)
        teacher = tiny_teacher(dev, tok.get_vocab_size(), args.teacher_steps, rows)
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
    healed, _plan = prune_model(teacher, importance, targets)
    healed = healed.float().requires_grad_(True)
    scratch = GPT(cfg).to(dev.torch_device)
    scratch.init_weights(seed=0)
    results = {"teacher": perplexity(teacher, held_out, dev), "pruned": perplexity(healed, held_out, dev)}

    sides = {"healed": (healed, torch.optim.AdamW(healed.parameters(), lr=args.lr_heal)),
             "scratch": (scratch, torch.optim.AdamW(scratch.parameters(), lr=args.lr_scratch))}
    seconds = {name: 0.0 for name in sides}
    distill = DistillHook(healed, InProcessTeacher(teacher, "teacher"), DistillLoss()) if args.heal == "distill" else None

    def step_loss(name: str, model: GPT, idx: torch.Tensor) -> torch.Tensor:
        if name == "healed" and distill is not None:  # mean forward KL per predicted token
            return distill(model, Batch(inputs=idx[:, :-1], targets=idx[:, 1:])) / idx[:, 1:].numel()
        return model(idx[:, :-1], idx[:, 1:])

    for step in range(args.steps):
        idx = train[(step * args.batch_size) % len(train):][: args.batch_size].to(dev.torch_device)
        for name in (sides if step % 2 == 0 else reversed(list(sides))):  # alternate the order
            model, opt = sides[name]
            model.train()
            start = time.perf_counter()
            with dev.autocast():
                loss = step_loss(name, model, idx)
            opt.zero_grad()
            loss.backward()
            opt.step()
            dev.synchronize()
            seconds[name] += time.perf_counter() - start
    results["healed"] = perplexity(healed, held_out, dev)
    results["scratch"] = perplexity(scratch, held_out, dev)
    ratio = results["scratch"] / results["healed"]
    tokens = args.steps * args.batch_size * args.seq_len
    print(f"device {dev.type}; {teacher.config.n_layer} -> {cfg.n_layer} layers, "
          f"{sum(p.numel() for p in healed.parameters()):,} parameters; budget {args.steps} steps = {tokens:,} tokens; "
          f"heal: {args.heal}")
    for name in ("teacher", "pruned", "healed", "scratch"):
        extra = f"  ({seconds[name]:.1f} s training)" if name in seconds else ""
        print(f"  {name:8s} perplexity {results[name]:10.3f}{extra}")
    print(f"ratio (scratch / prune+heal perplexity): {ratio:.2f}x")
    if args.json:
        print(json.dumps({"perplexity": results, "ratio": ratio, "seconds": seconds, "steps": args.steps,
                          "tokens": tokens, "heal": args.heal, "layers": [teacher.config.n_layer, cfg.n_layer]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
