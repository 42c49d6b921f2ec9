"""Pretraining documents from the synthetic curriculum: the plain examples (curriculum.py, zh.py)
rendered in varied styles, and the chat tasks (tasks.py) in their own phrasing; held-out questions
(heldout.py) never appear. `SyntheticSource` serves them as a pretraining document source."""

from __future__ import annotations

import random

from portachat.data.document_source import DocumentSource, check_split_args, split_range
from portachat.data.synthetic.curriculum import _QA_TEMPLATES, TASKS, Example, _draw
from portachat.data.synthetic.heldout import question_key, split_of
from portachat.data.synthetic.tasks import ZH_FRACTION as TASK_ZH_FRACTION
from portachat.data.synthetic.tasks import TaskExample, task_examples
from portachat.data.synthetic.zh import QA_TEMPLATES_ZH


def render_document(examples: list[Example], rng: random.Random) -> str:
    """One pretraining document: the examples as statements or Q/A lines, in a varied style (the
    same style in either language: "Question: ... Answer: ..." next to "问题：... 答案：...")."""
    style = rng.randrange(len(_QA_TEMPLATES) + 1)  # the extra style: plain statements
    lines = [
        ex.statement if style == len(_QA_TEMPLATES) else
        (QA_TEMPLATES_ZH if ex.lang == "zh" else _QA_TEMPLATES)[style].format(q=ex.question, a=ex.answer)
        for ex in examples
    ]
    return "\n".join(lines)


def _not_heldout(example: Example) -> bool:
    """False for a question the chat curriculum holds out (pretraining must never show it)."""
    key = question_key(example.question)
    return key is None or split_of(key) != "heldout"


ZH_FRACTION = 0.5  # the share of Chinese documents (and of Chinese examples in mixed ones)
MIXED_DOCS = 0.1  # the share of documents that mix both languages, example by example


def synthetic_documents(n: int, seed: int | str = 0, zh_fraction: float = ZH_FRACTION) -> list[str]:
    """n pretraining documents of 1-6 examples each, deterministic in `seed`: Chinese with
    probability `zh_fraction`, else English, and a few mixing both; questions of the chat
    curriculum's held-out split (in either language) are left out."""
    if not 0.0 <= zh_fraction <= 1.0:
        raise ValueError(f"zh_fraction must be between 0 and 1, got {zh_fraction}")
    rng = random.Random(f"portachat-synthetic-docs:{seed}")
    names = tuple(TASKS)
    docs = []
    for _ in range(n):
        mixed = rng.random() < MIXED_DOCS
        doc_lang = "zh" if rng.random() < zh_fraction else "en"
        langs = [("zh" if rng.random() < zh_fraction else "en") if mixed else doc_lang
                 for _ in range(rng.randint(1, 6))]
        examples = [_draw(rng, rng.choice(names), lang) for lang in langs]
        examples = [ex for ex in examples if _not_heldout(ex)] or [_draw(rng, "facts", doc_lang)]
        docs.append(render_document(examples, rng))
    return docs


class SyntheticSource(DocumentSource):
    """The curriculum as a document source: `num_units` units of `docs_per_unit` documents each,
    generated on demand from (seed, unit) so memory stays small. The last `val_fraction` of units
    is the val split."""

    def __init__(self, split: str = "train", val_fraction: float = 0.05, num_units: int = 2000,
                 docs_per_unit: int = 64, seed: int = 0):
        check_split_args(split, val_fraction)
        self._unit_ids = split_range(num_units, split, val_fraction, "synthetic")
        self.num_units = len(self._unit_ids)
        self.docs_per_unit = docs_per_unit
        self.seed = seed
        self.name = f"synthetic(seed={seed}) [{split}]"

    def read_unit(self, u: int) -> list[str]:
        """Half plain curriculum documents, half the chat tasks in their own phrasing (tool calls
        included), so pretraining already speaks the language the chat stages are taught in."""
        self._check_unit(u)
        seed = f"{self.seed}:{self._unit_ids[u]}"
        half = self.docs_per_unit // 2
        plain = synthetic_documents(self.docs_per_unit - half, seed=seed)
        tasks = task_documents(half, seed=seed)
        return [doc for pair in zip(plain, tasks, strict=False) for doc in pair] + plain[len(tasks):]


def render_text(ex: TaskExample) -> str:
    """The example as plain text: the question, the tool call written as `expr = output`, the answer."""
    out = []
    parts = ex.assistant
    i = 0
    while i < len(parts):
        part = parts[i]
        if part["type"] == "python":
            result = parts[i + 1]["text"] if i + 1 < len(parts) and parts[i + 1]["type"] == "python_output" else ""
            out.append(f"{part['text']} = {result}".strip())
            i += 2 if result else 1
            continue
        out.append(part["text"])
        i += 1
    return f"{ex.question}\n" + " ".join(out)


def task_documents(n: int, seed: int | str = 0, per_doc: tuple[int, int] = (1, 6),
                   zh_fraction: float = TASK_ZH_FRACTION) -> list[str]:
    """n pretraining documents, each `per_doc` train-split examples in chat phrasing, one per paragraph,
    in both languages (mixed within a document)."""
    rng = random.Random(f"portachat-task-docs:{seed}")
    docs = []
    for i in range(n):
        k = rng.randint(*per_doc)
        examples = task_examples(k, "train", f"doc:{seed}:{i}", zh_fraction=zh_fraction)
        docs.append("\n\n".join(render_text(ex) for ex in examples))
    return docs


class TaskDocumentSource(DocumentSource):
    """`task_documents` as a pretraining document source (like SyntheticSource): `num_units`
    units of `docs_per_unit` documents, generated on demand; the last `val_fraction` of units is val.
    Every document holds train-split questions only."""

    def __init__(self, split: str = "train", val_fraction: float = 0.05, num_units: int = 2000,
                 docs_per_unit: int = 64, seed: int = 0):
        check_split_args(split, val_fraction)
        self._unit_ids = split_range(num_units, split, val_fraction, "synthetic tasks")
        self.num_units = len(self._unit_ids)
        self.docs_per_unit = docs_per_unit
        self.seed = seed
        self.name = f"synthetic-tasks(seed={seed}) [{split}]"

    def read_unit(self, u: int) -> list[str]:
        self._check_unit(u)
        return task_documents(self.docs_per_unit, seed=f"{self.seed}:{self._unit_ids[u]}")
