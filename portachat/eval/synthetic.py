"""Accuracy on the held-out split of the synthetic task curriculum (portachat/data/synthetic/tasks.py)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from portachat.data.synthetic.tasks import heldout_set
from portachat.eval.generation import CompleteFn
from portachat.eval.report import EvalResult

MAX_TOKENS = 64  # the longest reference reply is ~40 tokens


def evaluate_synthetic(
    complete: CompleteFn,
    n: int = 200,
    seed: int = 0,
    tasks: Sequence[str] | None = None,
    max_tokens: int = MAX_TOKENS,
    batch_size: int = 64,
) -> EvalResult:
    """Greedy answers to `n` held-out questions (English and Chinese), checked by each task's verifier;
    accuracy per task and per language (details["per_task"], details["per_lang"])."""
    examples = heldout_set(n, seed=seed, tasks=tasks)
    correct: dict[str, list[bool]] = defaultdict(list)
    by_lang: dict[str, list[bool]] = defaultdict(list)
    samples = []
    for i in range(0, len(examples), batch_size):
        chunk = examples[i:i + batch_size]
        replies = complete([ex.prompt for ex in chunk], max_tokens, 0.0)
        for ex, reply in zip(chunk, replies, strict=True):
            ok = ex.verify(reply)
            correct[ex.task].append(ok)
            by_lang[ex.lang].append(ok)
            by_lang[f"{ex.lang}/{ex.task}"].append(ok)
            if len(samples) < 8:
                samples.append({"question": ex.question, "lang": ex.lang, "expected": ex.answer, "reply": reply,
                                "correct": ok})
    total = sum(sum(v) for v in correct.values())
    per_task = {t: sum(v) / len(v) for t, v in sorted(correct.items())}
    # Chinese against English on the same tasks: "zh", "en", then "zh/<task>", "en/<task>".
    per_lang = {k: sum(v) / len(v) for k, v in sorted(by_lang.items(), key=lambda kv: ("/" in kv[0], kv[0]))}
    return EvalResult("synthetic", "accuracy", total / max(1, len(examples)), len(examples), 0.0,
                      {"per_task": per_task, "per_lang": per_lang, "samples": samples})
