"""GSM8K: grade-school math word problems, answered generatively (the calculator tool allowed).

Public format (openai/gsm8k): one row per problem, {"question": str, "answer": str} where the
answer is worked steps with calculator annotations `<<48/2=24>>` and a last line `#### 72`.
A reply is right when its final number equals the reference: the number after its last `####`,
else after its last "The answer is", else the last number in its text after the last tool output.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from portachat.data.synthetic.tasks import extract_answer, final_segment
from portachat.eval.data_files import EvalDataError, read_rows
from portachat.eval.generation import CompleteFn
from portachat.eval.report import EvalResult
from portachat.i18n import _

MAX_TOKENS = 256
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


@dataclass(frozen=True)
class GSM8KProblem:
    question: str
    solution: str  # the reference working, annotations included
    answer: str  # the final number, normalised


def normalize_number(text: str) -> str | None:
    """'1,234.50' -> '1234.5', '$18' -> '18'; None if there is no number."""
    m = _NUMBER.search(text.replace("$", ""))
    if m is None:
        return None
    s = m.group(0).replace(",", "")
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return s


def read_gsm8k(path: str | Path, limit: int | None = None) -> list[GSM8KProblem]:
    problems = []
    for i, row in enumerate(read_rows(Path(path))):
        if not isinstance(row.get("question"), str) or not isinstance(row.get("answer"), str) or "####" not in row["answer"]:
            raise EvalDataError(
                _("{path}: row {row} is not in GSM8K's format ({shape})").format(
                    path=path, row=i + 1, shape="{'question': str, 'answer': '... #### N'}")
            )
        answer = normalize_number(row["answer"].rsplit("####", 1)[1])
        if answer is None:
            raise EvalDataError(_("{path}: row {row} has no number after ####").format(path=path, row=i + 1))
        problems.append(GSM8KProblem(row["question"], row["answer"], answer))
        if limit is not None and len(problems) >= limit:
            break
    if not problems:
        raise EvalDataError(_("{path} holds no GSM8K problems").format(path=path))
    return problems


def predicted_answer(reply: str) -> str | None:
    """The reply's final number (see the module docstring for the order of preference)."""
    text = final_segment(reply)
    if "####" in text:
        return normalize_number(text.rsplit("####", 1)[1])
    said = extract_answer(reply)
    if said is not None and normalize_number(said) is not None:
        return normalize_number(said)
    numbers = _NUMBER.findall(text)
    return normalize_number(numbers[-1]) if numbers else None


def is_correct(reply: str, answer: str) -> bool:
    got = predicted_answer(reply)
    if got is None:
        return False
    try:
        return abs(float(got) - float(answer)) < 1e-6
    except ValueError:
        return got == answer


def conversation(problem: GSM8KProblem) -> list[dict[str, Any]]:
    """The problem as a training conversation: each `<<expr=result>>` becomes a calculator call and
    its output, and the reply ends with `#### N` (nanochat's rendering, for mid-training and SFT)."""
    parts: list[dict[str, str]] = []
    text = problem.solution
    pos = 0
    for m in re.finditer(r"<<([^=<>]*)=([^<>]*)>>", text):
        if m.start() > pos:
            parts.append({"type": "text", "text": text[pos:m.start()]})
        parts.append({"type": "python", "text": m.group(1)})
        parts.append({"type": "python_output", "text": m.group(2)})
        pos = m.end()
    if pos < len(text):
        parts.append({"type": "text", "text": text[pos:]})
    return [{"role": "user", "content": problem.question}, {"role": "assistant", "content": parts}]


def evaluate_gsm8k(
    complete: CompleteFn,
    problems: Iterable[GSM8KProblem],
    max_tokens: int = MAX_TOKENS,
    batch_size: int = 32,
) -> EvalResult:
    """Greedy answers, exact match of the final number."""
    problems = list(problems)
    right, samples = 0, []
    for i in range(0, len(problems), batch_size):
        chunk = problems[i:i + batch_size]
        replies = complete([[{"role": "user", "content": p.question}] for p in chunk], max_tokens, 0.0)
        for p, reply in zip(chunk, replies, strict=True):
            ok = is_correct(reply, p.answer)
            right += ok
            if len(samples) < 5:
                samples.append({"question": p.question, "expected": p.answer, "reply": reply, "correct": ok})
    return EvalResult("gsm8k", "accuracy", right / max(1, len(problems)), len(problems), 0.0, {"samples": samples})
