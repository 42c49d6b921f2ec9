"""HumanEval: write a Python function from its signature and docstring; pass@1 over the unit tests,
each run in the sandbox (portachat/eval/sandbox.py).

Public format (openai/openai_humaneval, or human-eval's HumanEval.jsonl.gz): {"task_id", "prompt",
"canonical_solution", "test", "entry_point"}. The program run for a completion is the prompt, the
completion, the tests, and `check(entry_point)`; it passes when it runs to the end.
"""

from __future__ import annotations

import os
import queue
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from portachat.eval.data_files import EvalDataError, read_rows
from portachat.eval.generation import MARKERS, CompleteFn
from portachat.eval.report import EvalResult
from portachat.eval.sandbox import SandboxLimits, SandboxResult, require_isolation, run_program
from portachat.i18n import _

MAX_TOKENS = 384
FIELDS = ("task_id", "prompt", "canonical_solution", "test", "entry_point")


@dataclass(frozen=True)
class HumanEvalProblem:
    task_id: str
    prompt: str
    canonical_solution: str
    test: str
    entry_point: str


def read_humaneval(path: str | Path, limit: int | None = None) -> list[HumanEvalProblem]:
    out = []
    for i, row in enumerate(read_rows(Path(path))):
        if not all(isinstance(row.get(k), str) for k in FIELDS):
            raise EvalDataError(_("{path}: row {row} is not a HumanEval problem (needs string fields {fields})").format(
                path=path, row=i + 1, fields=FIELDS))
        out.append(HumanEvalProblem(*(row[k] for k in FIELDS)))
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise EvalDataError(_("{path} holds no HumanEval problems").format(path=path))
    return out


def completion_code(problem: HumanEvalProblem, reply: str) -> str:
    """The code a reply means: its first fenced block if any, else the reply; tool markers dropped."""
    for marker in MARKERS:
        reply = reply.replace(marker, "")
    m = re.search(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)(?:```|$)", reply, re.S)
    return m.group(1) if m else reply


def program_for(problem: HumanEvalProblem, completion: str) -> str:
    """The program to run: a completion that (re)defines the entry point follows the whole prompt (so
    the prompt's imports and helpers stay); anything else continues the prompt's function body."""
    if re.search(rf"^def {re.escape(problem.entry_point)}\s*\(", completion, re.M):
        body = problem.prompt + "\n" + completion
    else:
        body = problem.prompt + completion
    return f"{body}\n\n{problem.test}\n\ncheck({problem.entry_point})\n"


def check_completions(
    problems: Sequence[HumanEvalProblem],
    completions: Sequence[str],
    limits: SandboxLimits | None = None,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[SandboxResult]:
    """Run each problem's tests against its completion in the sandbox, `workers` at a time."""
    if len(problems) != len(completions):
        raise ValueError(f"{len(problems)} problems but {len(completions)} completions")
    workers = workers or min(4, os.cpu_count() or 1)
    limits = limits or SandboxLimits()
    programs = [program_for(p, c) for p, c in zip(problems, completions, strict=True)]
    results: list[SandboxResult | None] = [None] * len(programs)
    slots: queue.Queue[int] = queue.Queue()
    for k in range(workers):
        slots.put(k)

    def run_in_a_slot(program: str) -> SandboxResult:
        # each running sandbox has its own slot (own uid under root), so a hostile program cannot
        # exhaust the process limit of another one running at the same time
        slot = slots.get()
        try:
            return run_program(program, replace(limits, slot=slot))
        finally:
            slots.put(slot)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(run_in_a_slot, prog): i for i, prog in enumerate(programs)}
        for done, fut in enumerate(futures, start=1):
            results[futures[fut]] = fut.result()
            if progress is not None:
                progress(done, len(programs))
    return [r for r in results if r is not None]


def evaluate_humaneval(
    complete: CompleteFn,
    problems: Sequence[HumanEvalProblem],
    max_tokens: int = MAX_TOKENS,
    limits: SandboxLimits | None = None,
    workers: int | None = None,
    batch_size: int = 16,
) -> EvalResult:
    """pass@1 with greedy completions. Raises SandboxUnavailable before generating anything when the
    programs could not run confined and `limits.allow_unsandboxed` is off."""
    limits = limits or SandboxLimits()
    require_isolation(limits)
    problems = list(problems)
    replies: list[str] = []
    for i in range(0, len(problems), batch_size):
        chunk = problems[i:i + batch_size]
        replies += complete([[{"role": "user", "content": p.prompt}] for p in chunk], max_tokens, 0.0)
    completions = [completion_code(p, r) for p, r in zip(problems, replies, strict=True)]
    results = check_completions(problems, completions, limits, workers)
    passed = sum(r.passed for r in results)
    statuses: dict[str, int] = {}
    for r in results:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    isolation = results[0].isolation if results else []
    return EvalResult("humaneval", "pass@1", passed / max(1, len(problems)), len(problems), 0.0,
                      {"statuses": statuses, "isolation": isolation})
