"""`portachat eval [bpb|synthetic|gsm8k|arc|mmlu|ceval|cmmlu|humaneval|core|all] --model PATH`: evaluations.

What runs. The flags are in commands/eval.py, which `--help` imports without torch."""

from __future__ import annotations

import argparse

from portachat.eval.report import format_table, to_json
from portachat.eval.run import EvalOptions, run_evals


def cmd_eval(args: argparse.Namespace) -> int:
    opts = EvalOptions(
        task=args.task, model=args.model, data=args.data, limit=args.limit, device=args.device, dtype=args.dtype,
        max_tokens=args.max_tokens, seed=args.seed, workers=args.workers, quantize=args.quantize,
        shots=args.shots,
        tensor_parallel_size=args.tensor_parallel_size, allow_unsandboxed_code=args.allow_unsandboxed_code,
    )
    log = (lambda _msg: None) if args.json else print
    results = run_evals(opts, log=log)
    print(to_json(results) if args.json else format_table(results))
    return 0
