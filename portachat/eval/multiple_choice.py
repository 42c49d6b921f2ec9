"""ARC and MMLU: multiple choice, scored by comparing the logits of the option letters.

The question and its options go to the model as one user message (nanochat's rendering); the
prediction is whichever option letter gets the highest logit as the first token of the reply.
One forward pass per question, batched; no sampling, so the score is exact and cheap.

Public formats read from local files (jsonl / parquet / csv):
  ARC  (allenai/ai2_arc): {"question": str, "choices": {"text": [...], "label": [...]}, "answerKey": "A"}
       (AI2's original jsonl, {"question": {"stem", "choices": [{"text", "label"}]}, "answerKey"}, too)
  MMLU (cais/mmlu): {"question": str, "subject": str, "choices": [4 strings], "answer": 0-3}
       (the original csv rows, question,A,B,C,D,answer-letter, with the subject from the file name, too)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from portachat.eval.data_files import EvalDataError, data_files, read_rows
from portachat.eval.generation import next_token_logits
from portachat.eval.report import EvalResult
from portachat.i18n import _
from portachat.tokenizer.protocol import ChatTokenizer

LETTERS = "ABCDEFGHIJ"


@dataclass(frozen=True)
class MCQuestion:
    question: str
    choices: tuple[str, ...]
    answer: int  # index into choices
    subject: str = ""


def render_question(q: MCQuestion) -> list[dict[str, Any]]:
    lines = [f"Multiple Choice question: {q.question}"]
    lines += [f"- {choice}={LETTERS[i]}" for i, choice in enumerate(q.choices)]
    lines += ["", "Respond only with the letter of the correct answer."]
    return [{"role": "user", "content": "\n".join(lines)}]


def _arc_row(row: dict[str, Any], where: str) -> MCQuestion:
    question, choices = row.get("question"), row.get("choices")
    if isinstance(question, dict):  # AI2's original layout
        question, choices = question.get("stem"), question.get("choices")
        if isinstance(choices, list):
            choices = {"text": [c.get("text") for c in choices], "label": [c.get("label") for c in choices]}
    if not isinstance(question, str) or not isinstance(choices, dict) or "answerKey" not in row:
        raise EvalDataError(_("{where} is not an ARC row ({shape})").format(
            where=where, shape="{'question', 'choices': {'text', 'label'}, 'answerKey'}"))
    labels, texts = list(choices.get("label") or []), list(choices.get("text") or [])
    key = str(row["answerKey"]).strip()
    if len(labels) != len(texts) or key not in labels or not 2 <= len(texts) <= len(LETTERS):
        raise EvalDataError(_("{where}: answerKey {key} is not one of the labels {labels}").format(
            where=where, key=repr(key), labels=labels))
    return MCQuestion(question, tuple(texts), labels.index(key))


def _mmlu_row(row: dict[str, Any], where: str, subject: str) -> MCQuestion:
    if "choices" in row:
        choices, answer = row.get("choices"), row.get("answer")
        if isinstance(answer, str) and answer.strip().upper() in LETTERS:
            answer = LETTERS.index(answer.strip().upper())
        if not isinstance(row.get("question"), str) or not isinstance(choices, list) or not isinstance(answer, int) \
                or not 0 <= answer < len(choices):
            raise EvalDataError(_("{where} is not an MMLU row ({shape})").format(
                where=where, shape="{'question', 'choices': [...], 'answer': int}"))
        return MCQuestion(row["question"], tuple(map(str, choices)), answer, str(row.get("subject") or subject))
    cells = [row.get(str(i)) for i in range(6)]  # original csv: question, A, B, C, D, letter
    if any(c is None for c in cells) or cells[5].strip().upper() not in "ABCD":
        raise EvalDataError(_("{where} is not an MMLU row (jsonl/parquet with question/choices/answer, or csv "
                              "question,A,B,C,D,answer)").format(where=where))
    return MCQuestion(cells[0], tuple(cells[1:5]), "ABCD".index(cells[5].strip().upper()), subject)


def read_arc(path: str | Path, limit: int | None = None) -> list[MCQuestion]:
    out = []
    for i, row in enumerate(read_rows(Path(path))):
        out.append(_arc_row(row, _("{path}: row {row}").format(path=path, row=i + 1)))
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise EvalDataError(_("{path} holds no ARC questions").format(path=path))
    return out


def read_mmlu(path: str | Path, limit: int | None = None) -> list[MCQuestion]:
    out = []
    for file in data_files(Path(path)):
        subject = file.name.split(".")[0].removesuffix("_test").removesuffix("_dev").removesuffix("_val")
        for i, row in enumerate(read_rows(file)):
            out.append(_mmlu_row(row, _("{path}: row {row}").format(path=file, row=i + 1), subject))
            if limit is not None and len(out) >= limit:
                return out
    if not out:
        raise EvalDataError(_("{path} holds no MMLU questions").format(path=path))
    return out


def letter_ids(tokenizer: ChatTokenizer, n: int) -> list[int]:
    ids = []
    for letter in LETTERS[:n]:
        enc = tokenizer.encode(letter)
        if len(enc) != 1:
            raise ValueError(_("the tokenizer splits the option letter {letter} into {count} tokens").format(
                letter=repr(letter), count=len(enc)))
        ids.append(enc[0])
    return ids


def evaluate_multiple_choice(
    task: str,
    model: torch.nn.Module,
    tokenizer: ChatTokenizer,
    questions: list[MCQuestion],
    batch_size: int = 16,
    autocast: Callable[[], Any] | None = None,
) -> EvalResult:
    """Accuracy of the highest-logit option letter; chance is the mean of 1/len(choices)."""
    if not questions:
        raise EvalDataError(_("no {task} questions to evaluate").format(task=task))
    prompts = [tokenizer.render_prompt(render_question(q)) for q in questions]
    max_len = getattr(getattr(model, "config", None), "max_seq_len", None)
    if max_len is not None:  # keep the end of an over-long prompt: the options and the instruction
        prompts = [p if len(p) <= max_len else p[-max_len:] for p in prompts]
    return score_letter_prompts(task, model, tokenizer, questions, prompts, batch_size, autocast)


def score_letter_prompts(
    task: str,
    model: torch.nn.Module,
    tokenizer: ChatTokenizer,
    questions: list[MCQuestion],
    prompts: list[list[int]],
    batch_size: int = 16,
    autocast: Callable[[], Any] | None = None,
) -> EvalResult:
    """Score rendered prompts (one per question, each ending where the reply begins) by the logits of
    the option letters. Per-subject accuracies and their mean go to details when there are several."""
    if not questions:
        raise EvalDataError(_("no {task} questions to evaluate").format(task=task))
    logits = next_token_logits(model, prompts, batch_size=batch_size, autocast=autocast)
    all_letters = letter_ids(tokenizer, max(len(q.choices) for q in questions))
    per_subject: dict[str, list[bool]] = defaultdict(list)
    right = 0
    for q, row in zip(questions, logits, strict=True):
        options = torch.tensor(all_letters[:len(q.choices)])
        ok = int(row[options].argmax()) == q.answer
        right += ok
        per_subject[q.subject].append(ok)
    chance = sum(1 / len(q.choices) for q in questions) / len(questions)
    details: dict[str, Any] = {}
    if len(per_subject) > 1:
        details["per_task"] = {s: sum(v) / len(v) for s, v in sorted(per_subject.items())}
        details["subject_mean"] = sum(details["per_task"].values()) / len(per_subject)
    return EvalResult(task, "accuracy", right / len(questions), len(questions), chance, details)
