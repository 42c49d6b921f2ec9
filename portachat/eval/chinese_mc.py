"""C-Eval and CMMLU: Chinese multiple choice, few-shot from the dev split, scored like MMLU by the
logits of the option letters.

Public formats, read from a directory or straight from the released .zip:
  C-Eval (ceval/ceval-exam): csv `id,question,A,B,C,D,answer,explanation` as
         dev/<subject>_dev.csv, val/<subject>_val.csv, test/<subject>_test.csv (the test answers are
         not public, so the val split is scored), or the Hub's parquet <subject>/{dev,val,test}-*.parquet
  CMMLU  (haonan-li/cmmlu): csv `,Question,A,B,C,D,Answer` as dev/<subject>.csv and test/<subject>.csv
         (cmmlu_v1_0_1.zip), or parquet <subject>/{dev,test}/*.parquet; the test split is scored.

The prompt is each benchmark's own Chinese one, as a chat: the header and the first solved dev
example are the first user turn, each example's letter an assistant turn, the question the last
user turn; the prediction is the option letter with the highest logit where the reply begins. When
k shots do not fit the model's context, fewer are used (as C-Eval's own harness does).
"""

from __future__ import annotations

import csv
import io
import re
import zipfile
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import torch

from portachat.eval.chinese_subjects import CEVAL_SUBJECTS, CMMLU_SUBJECTS
from portachat.eval.data_files import EvalDataError
from portachat.eval.multiple_choice import MCQuestion, score_letter_prompts
from portachat.eval.report import EvalResult
from portachat.i18n import _
from portachat.tokenizer.protocol import ChatTokenizer

SPLITS = ("dev", "val", "test")
DEFAULT_SHOTS = 5
_SPLIT_IN_NAME = re.compile(r"(?:^|[_-])(dev|val|test)(?:[_-]|$)")
_SPLIT_SUFFIX = re.compile(r"[_-](dev|val|test)$")
_OPTIONS = ("A", "B", "C", "D")


@dataclass(frozen=True)
class Benchmark:
    task: str  # "ceval" / "cmmlu"
    title: str  # for messages
    eval_split: str  # the split with public answers that is scored
    header: str  # the benchmark's instruction, {subject} = the subject's Chinese name
    question_prefix: str
    answer_cue: str
    names: dict[str, str]  # subject -> Chinese name


CEVAL = Benchmark("ceval", "C-Eval", "val", "以下是中国关于{subject}考试的单项选择题，请选出其中的正确答案。", "", "答案：",
                  {k: v[0] for k, v in CEVAL_SUBJECTS.items()})
CMMLU = Benchmark("cmmlu", "CMMLU", "test", "以下是关于{subject}的单项选择题，请直接给出正确答案的选项。", "题目：", "答案是：",
                  CMMLU_SUBJECTS)
BENCHMARKS = {b.task: b for b in (CEVAL, CMMLU)}


@dataclass
class ChineseMC:
    """One benchmark's questions to score and the dev examples of each subject."""

    benchmark: Benchmark
    questions: list[MCQuestion]
    shots: dict[str, list[MCQuestion]]


# ----------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class _File:
    rel: PurePosixPath  # path inside the directory or zip: says split and subject
    where: str  # for messages
    read: Callable[[], bytes]


def _zip_files(path: Path) -> list[_File]:
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile as exc:
        raise EvalDataError(_("{path} is not a readable zip file ({error})").format(path=path, error=exc)) from None
    names = [n for n in archive.namelist() if n.lower().endswith((".csv", ".parquet"))
             and not any(part.startswith((".", "__MACOSX")) for part in n.split("/"))]
    return [_File(PurePosixPath(n), f"{path}:{n}", lambda n=n: archive.read(n)) for n in sorted(names)]


def _files(path: Path) -> list[_File]:
    """The csv/parquet files at `path`: a directory (searched deeply, zips in it opened), a zip, or one file."""
    if path.is_file() and path.suffix.lower() == ".zip":
        return _zip_files(path)
    if path.is_file():
        return [_File(PurePosixPath(path.parent.name, path.name), str(path), path.read_bytes)]
    if path.is_dir():
        out: list[_File] = []
        for p in sorted(path.rglob("*")):
            rel = p.relative_to(path)
            if not p.is_file() or any(part.startswith(".") for part in rel.parts):
                continue
            if p.suffix.lower() == ".zip":  # the CMMLU release as downloaded
                out += _zip_files(p)
            elif p.suffix.lower() in (".csv", ".parquet"):
                out.append(_File(PurePosixPath(rel.as_posix()), str(p), p.read_bytes))
        return out
    raise EvalDataError(_("no evaluation data at {path}: pass --data DIR_OR_ZIP").format(path=path))


def _split_and_subject(rel: PurePosixPath) -> tuple[str | None, str]:
    """('val', 'computer_network') from val/computer_network_val.csv, computer_network/val-0000.parquet,
    computer_network/ceval-exam-val.parquet, agronomy/test/0000.parquet or test/agronomy.csv."""
    dirs, stem = rel.parts[:-1], rel.name.rsplit(".", 1)[0]
    split = next((d for d in reversed(dirs) if d in SPLITS), None)
    named = _SPLIT_IN_NAME.search(stem)
    split = split or (named.group(1) if named else None)
    subject = _SPLIT_SUFFIX.sub("", stem)
    if rel.suffix.lower() == ".parquet" or stem in SPLITS:  # the Hub's layouts name the subject by folder
        subject = next((d for d in reversed(dirs) if d not in SPLITS), subject)
    return split, subject


def _rows(file: _File) -> list[dict[str, str]]:
    data = file.read()
    try:
        if file.rel.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq  # deferred: slow import, parquet only

            rows = pq.read_table(io.BytesIO(data)).to_pylist()
        else:
            rows = list(csv.DictReader(io.StringIO(data.decode("utf-8-sig"), newline="")))
    except UnicodeDecodeError as exc:
        raise EvalDataError(_("{path} is not UTF-8 text ({error})").format(path=file.where, error=exc)) from None
    except Exception as exc:  # pyarrow raises its own error types on a damaged file
        if type(exc).__module__.startswith("pyarrow"):
            raise EvalDataError(_("{path} is not a readable parquet file: {error}").format(
                path=file.where, error=exc)) from None
        raise
    return [{str(k).strip().lower(): "" if v is None else str(v).strip() for k, v in row.items() if k is not None}
            for row in rows]


def _question(bench: Benchmark, row: dict[str, str], where: str, subject: str) -> MCQuestion | None:
    """The row as a question; None when its answer is withheld (C-Eval's test split)."""
    if "question" not in row or any(o.lower() not in row for o in _OPTIONS):
        raise EvalDataError(_("{where} is not a {title} row: expected columns question, A, B, C, D, answer (got "
                              "{columns})").format(where=where, title=bench.title,
                                                   columns=", ".join(sorted(row)) or _("none")))
    answer = row.get("answer", "").upper()  # C-Eval's test csv has no answer column at all
    if not answer:
        return None
    if answer not in _OPTIONS:
        raise EvalDataError(_("{where}: answer {answer} is not one of A, B, C, D").format(
            where=where, answer=repr(row["answer"])))
    return MCQuestion(row["question"], tuple(row[o.lower()] for o in _OPTIONS), _OPTIONS.index(answer), subject)


def read_chinese_mc(bench: Benchmark | str, path: str | Path, limit: int | None = None,
                    subjects: list[str] | None = None) -> ChineseMC:
    """The scored split's questions (first `limit` in subject order) and every subject's dev examples."""
    bench = BENCHMARKS[bench] if isinstance(bench, str) else bench
    path = Path(path).expanduser()
    by_split: dict[str, dict[str, list[MCQuestion]]] = {s: defaultdict(list) for s in SPLITS}
    unlabelled = 0
    for file in _files(path):
        split, subject = _split_and_subject(file.rel)
        if split is None or (subjects and subject not in subjects):
            continue
        for i, row in enumerate(_rows(file)):
            q = _question(bench, row, _("{path}: row {row}").format(path=file.where, row=i + 1), subject)
            if q is None:
                unlabelled += 1
            else:
                by_split[split][subject].append(q)
    scored = by_split[bench.eval_split]
    if not scored:
        extra = (" " + _("({count} rows without answers: {title}'s test answers are not public, the {split} split "
                         "is scored)").format(count=unlabelled, title=bench.title, split=bench.eval_split)
                 ) if unlabelled else ""
        raise EvalDataError(_("{path} holds no {title} {split} questions{extra}. Expected the released layout "
                              "({layout} and dev/...) or the Hub's parquet files, as a directory or a .zip").format(
            path=path, title=bench.title, split=bench.eval_split, extra=extra,
            layout=f"{bench.eval_split}/<subject>{'_val' if bench is CEVAL else ''}.csv"))
    questions = [q for subject in sorted(scored) for q in scored[subject]]
    return ChineseMC(bench, questions[:limit] if limit is not None else questions, dict(by_split["dev"]))


# ----------------------------------------------------------------------------- prompts


def subject_name(bench: Benchmark, subject: str) -> str:
    return bench.names.get(subject, subject.replace("_", " "))


def _body(bench: Benchmark, q: MCQuestion) -> str:
    options = "\n".join(f"{letter}. {text}" for letter, text in zip(_OPTIONS, q.choices, strict=True))
    return f"{bench.question_prefix}{q.question}\n{options}\n{bench.answer_cue}"


def conversation(bench: Benchmark, q: MCQuestion, shots: list[MCQuestion]) -> list[dict[str, Any]]:
    """Header + solved examples as earlier turns, then the question; the reply is to start with its letter."""
    turns: list[dict[str, Any]] = []
    for ex in [*shots, q]:
        turns.append({"role": "user", "content": _body(bench, ex)})
        if ex is not q:
            turns.append({"role": "assistant", "content": _OPTIONS[ex.answer]})
    header = bench.header.format(subject=subject_name(bench, q.subject))
    turns[0] = {"role": "user", "content": f"{header}\n\n{turns[0]['content']}"}
    return turns


def fitted_prompt(bench: Benchmark, tokenizer: ChatTokenizer, q: MCQuestion, shots: list[MCQuestion],
                  max_len: int | None) -> tuple[list[int], int]:
    """The rendered prompt with as many of `shots` as fit in `max_len` tokens, and how many that is."""
    for k in range(len(shots), -1, -1):
        ids = tokenizer.render_prompt(conversation(bench, q, shots[:k]))
        if max_len is None or len(ids) <= max_len:
            return ids, k
    return ids[-max_len:], 0  # even zero-shot is too long: keep the end (the options and the cue)


def evaluate_chinese_mc(
    data: ChineseMC,
    model: torch.nn.Module,
    tokenizer: ChatTokenizer,
    shots: int = DEFAULT_SHOTS,
    batch_size: int = 8,
    autocast: Callable[[], Any] | None = None,
) -> EvalResult:
    """Accuracy over all questions (value), per subject and the mean of subjects (details)."""
    if shots < 0:
        raise ValueError(f"shots must be >= 0, got {shots}")
    bench = data.benchmark
    if not data.questions:
        raise EvalDataError(_("no {task} questions to evaluate").format(task=bench.title))
    missing = sorted({q.subject for q in data.questions if not data.shots.get(q.subject)})
    if shots and missing:  # fewer than `shots` is fine (the dev split has 5 per subject); none is a mistake
        raise EvalDataError(_("{title}: no dev examples for {count} subject(s) ({subjects}) for {shots}-shot prompts; "
                              "give the whole release (with its dev split), or pass --shots 0").format(
            title=bench.title, count=len(missing), shots=shots,
            subjects=", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")))
    max_len = getattr(getattr(model, "config", None), "max_seq_len", None)
    prompts, used = [], []
    for q in data.questions:
        ids, k = fitted_prompt(bench, tokenizer, q, data.shots.get(q.subject, [])[:shots], max_len)
        prompts.append(ids)
        used.append(k)
    result = score_letter_prompts(bench.task, model, tokenizer, data.questions, prompts, batch_size, autocast)
    result.details["shots"] = shots
    result.details["mean_shots_used"] = sum(used) / len(used)
    if len({q.subject for q in data.questions}) == 1:
        result.details["per_task"] = {data.questions[0].subject: result.value}
        result.details["subject_mean"] = result.value
    if bench is CEVAL:  # C-Eval also publishes the mean of subjects within each of its four categories
        by_category: dict[str, list[float]] = defaultdict(list)
        for subject, value in result.details["per_task"].items():
            by_category[CEVAL_SUBJECTS.get(subject, ("", "Other"))[1]].append(value)
        result.details["per_category"] = {c: sum(v) / len(v) for c, v in sorted(by_category.items())}
    return result
