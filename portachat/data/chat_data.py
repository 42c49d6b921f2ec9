"""Conversations for the chat stages (mid, SFT, RL), read from local files in the public formats.

Accepted rows (jsonl lines or parquet rows), one conversation each:
  {"messages": [{"role", "content"}, ...]}            chat datasets (SmolTalk, our synthetic tasks)
  {"question": ..., "answer": "... <<4*5=20>>20 ... #### 20"}   GSM8K; calculator annotations become
                                                      python tool calls with their output, as nanochat does
  {"question", "choices": {"text": [...], "label": [...]}, "answerKey"}   ARC
  {"question", "choices": [...], "answer": 2}        MMLU (answer = index or letter)
Multiple choice renders as the question with lettered choices; the reply is the letter.

`--data hf:OWNER/NAME[:GLOB]` downloads a Hub dataset's files (default glob: the train split's parquet)
into <home>/chat_data/ once, when a network is there; later runs read the local copy.
`modelscope:OWNER/NAME[:GLOB]` does the same from ModelScope (see portachat.storage.hubs: HF_ENDPOINT,
HF_HUB_OFFLINE and PORTACHAT_HUB apply).
Without files, `synthetic_conversations` gives the built-in task curriculum (train split only).
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from portachat.data.document_source import DataError
from portachat.data.synthetic.tasks import dialogues, heldout_set
from portachat.i18n import _
from portachat.storage import hubs
from portachat.storage.paths import portachat_home
from portachat.tokenizer.chat import normalize_messages
from portachat.tokenizer.errors import ChatFormatError

Conversation = dict[str, Any]  # {"messages": [...]} plus, for verifiable rows, "answer"
CHAT_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".parquet")
HUB_PREFIX = "hf:"
HUB_PREFIXES = ("hf:", "modelscope:", "ms:")
HUB_DEFAULT_GLOB = "*train*.parquet"
LETTERS = "ABCDEFGHIJ"
_CALC = re.compile(r"<<([^<>]*)>>")


def gsm8k_messages(question: str, answer: str) -> list[dict[str, Any]]:
    """A GSM8K row as a conversation: `<<expr=result>>` becomes a python call and its output."""
    parts: list[dict[str, str]] = []
    for i, piece in enumerate(_CALC.split(answer)):
        if i % 2 == 0:
            if piece:
                parts.append({"type": "text", "text": piece})
            continue
        expr, _, result = piece.rpartition("=") if "=" in piece else (piece, "", "")
        parts.append({"type": "python", "text": expr})
        parts.append({"type": "python_output", "text": result})
    return [{"role": "user", "content": question}, {"role": "assistant", "content": parts}]


def gsm8k_final_answer(answer: str) -> str:
    """The number after '####' in a GSM8K answer, without thousands separators."""
    return answer.rsplit("####", 1)[-1].strip().replace(",", "")


def multiple_choice_prompt(question: str, choices: Sequence[str]) -> str:
    lines = [question.strip(), *(f"{LETTERS[i]}. {c}" for i, c in enumerate(choices))]
    return "\n".join(lines) + "\nAnswer with the letter of the correct choice."


def multiple_choice_messages(question: str, choices: Sequence[str], answer: int) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": multiple_choice_prompt(question, choices)},
        {"role": "assistant", "content": LETTERS[answer]},
    ]


def _mc_fields(row: Mapping[str, Any], where: str) -> tuple[str, list[str], int]:
    choices = row["choices"]
    if isinstance(choices, Mapping):  # ARC: {"text": [...], "label": ["A", ...]}
        texts, labels = list(choices["text"]), [str(x) for x in choices["label"]]
        key = str(row.get("answerKey", row.get("answer")))
        if key not in labels:
            raise DataError(_("{where}: answerKey {key} is not one of the labels {labels}").format(
                where=where, key=repr(key), labels=labels))
        index = labels.index(key)
    else:  # MMLU: a list, answer an index or a letter
        texts = [str(c) for c in choices]
        ans = row["answer"]
        index = LETTERS.index(ans.strip().upper()) if isinstance(ans, str) and not ans.strip().isdigit() else int(ans)
    if not 0 <= index < len(texts) or len(texts) > len(LETTERS):
        raise DataError(_("{where}: answer {index} is outside {n} choices (at most {most})").format(
            where=where, index=index, n=len(texts), most=len(LETTERS)))
    return str(row["question"]), texts, index


def row_to_conversation(row: Mapping[str, Any], where: str = "row") -> Conversation:
    """One dataset row in any accepted format -> {"messages": [...], "answer": str | None}."""
    if not isinstance(row, Mapping):
        raise DataError(_("{where}: expected a JSON object, got {type}").format(where=where, type=type(row).__name__))
    if "messages" in row:
        try:
            normalize_messages(row["messages"])  # fail here, naming the row, not in the middle of training
        except ChatFormatError as exc:
            raise DataError(_("{where}: {error}").format(where=where, error=exc)) from None
        return {"messages": list(row["messages"]), "answer": row.get("answer")}
    if "question" in row and "choices" in row:
        question, choices, index = _mc_fields(row, where)
        return {"messages": multiple_choice_messages(question, choices, index), "answer": LETTERS[index]}
    if "question" in row and isinstance(row.get("answer"), str):
        answer = row["answer"]
        return {"messages": gsm8k_messages(str(row["question"]), answer), "answer": gsm8k_final_answer(answer)}
    raise DataError(
        _("{where}: not a conversation. Expected a 'messages' list, GSM8K 'question'/'answer', or multiple "
          "choice 'question'/'choices'/'answer'; got keys {keys}").format(where=where, keys=sorted(row)[:8])
    )


def _jsonl_rows(path: Path) -> Iterator[tuple[str, Any]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield f"{path}:{lineno}", json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataError(_("{where}: not valid JSON ({error})").format(where=f"{path}:{lineno}", error=exc.msg)) from exc


def _parquet_rows(path: Path) -> Iterator[tuple[str, Any]]:
    import pyarrow.parquet as pq  # deferred: slow import, parquet only

    for i, row in enumerate(pq.read_table(path).to_pylist()):
        yield f"{path} row {i}", row


def data_rows(file: Path) -> Iterator[tuple[str, Any]]:
    """(where, row) for each row of a .jsonl/.json(.gz) or .parquet file; `where` is file:line or file row N."""
    return _parquet_rows(file) if file.suffix == ".parquet" else _jsonl_rows(file)


def hub_dataset(spec: str) -> Path:
    """`hf:OWNER/NAME[:GLOB]` (or `modelscope:...`) -> a local directory with the dataset's matching
    files (downloaded once)."""

    hub_name, _sep, rest = spec.partition(":")
    repo, _sep, pattern = rest.partition(":")
    if repo.count("/") != 1:
        raise DataError(_("--data {spec}: expected {hub_name}:OWNER/NAME or {hub_name}:OWNER/NAME:GLOB, "
                          "e.g. hf:openai/gsm8k:main/train-*").format(spec=spec, hub_name=hub_name))
    ref = hubs.parse_repo(f"{hub_name}:{repo}")
    sub = repo.replace("/", "__") if ref.hub == hubs.HF else f"{ref.hub}__{repo.replace('/', '__')}"
    dest = portachat_home() / "chat_data" / sub
    pattern = pattern or HUB_DEFAULT_GLOB
    if dest.is_dir() and any(p.name.endswith(CHAT_SUFFIXES) for p in dest.rglob("*")):
        return dest
    try:
        hubs.snapshot(ref, dest, repo_type="dataset", allow_patterns=[pattern, f"**/{pattern}"])
    except hubs.HubError as exc:
        raise DataError(_("--data {spec}: {error}. Without a network, download the files elsewhere and pass "
                          "--data FILE_OR_DIR.").format(spec=spec, error=exc)) from None
    except Exception as exc:  # offline, no access, a missing repo: the user's next move is the same
        where = "ModelScope" if ref.hub == hubs.MODELSCOPE else _("the Hugging Face Hub ({endpoint})").format(
            endpoint=hubs.hf_endpoint() or hubs.HF_DEFAULT_ENDPOINT)
        raise DataError(
            _("--data {spec}: downloading {repo} from {where} failed ({error_type}: {error}). "
              "Without a network, download the files elsewhere and pass --data FILE_OR_DIR.").format(
                spec=spec, repo=repo, where=where, error_type=type(exc).__name__, error=exc)
        ) from None
    if not any(p.name.endswith(CHAT_SUFFIXES) for p in dest.rglob("*")):
        raise DataError(_("--data {spec}: {ref} has no files matching {pattern}").format(
            spec=spec, ref=ref, pattern=repr(pattern)))
    return dest


def chat_files(spec: str | Path) -> list[Path]:
    """The .jsonl/.json/.parquet files a --data argument names (a file or a directory, searched deeply)."""
    if isinstance(spec, str) and spec.startswith(HUB_PREFIXES):
        spec = hub_dataset(spec)
    path = Path(spec).expanduser()
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(CHAT_SUFFIXES)
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if files:
            return files
        raise DataError(_("--data {spec}: no {suffixes} files in this directory").format(
            spec=spec, suffixes="/".join(CHAT_SUFFIXES)))
    raise DataError(_("--data {spec}: no such file or directory").format(spec=spec))


def load_conversations(specs: Sequence[str | Path], limit: int | None = None) -> list[Conversation]:
    """Every conversation in the files `specs` name, in order (each a file or a directory)."""
    out: list[Conversation] = []
    for spec in specs:
        for file in chat_files(spec):
            for where, row in data_rows(file):
                out.append(row_to_conversation(row, where))
                if limit is not None and len(out) >= limit:
                    return out
    if not out:
        raise DataError(_("--data {spec}: no conversations found").format(spec=", ".join(map(str, specs))))
    return out


def synthetic_heldout(n: int) -> list[Conversation]:
    """The held-out questions `portachat eval synthetic` asks (distinct, never trained on), as conversations."""
    return [{"messages": ex.messages, "answer": ex.answer, "task": ex.task, "lang": ex.lang} for ex in heldout_set(n)]


def synthetic_conversations(n: int, split: str = "train", seed: int | str = 0,
                            weights: Mapping[str, float] | None = None, mixed_turns: float = 0.0) -> list[Conversation]:
    """The built-in task curriculum as conversations with their expected answers and task names,
    tasks drawn by `weights` (None: the curriculum's default mix), in English and Chinese; with
    probability `mixed_turns` a conversation has an earlier turn in the other language (the answer
    and task are the last turn's)."""
    return [{"messages": [m for ex in turns for m in ex.messages], "answer": turns[-1].answer,
             "task": turns[-1].task, "lang": turns[-1].lang}
            for turns in dialogues(n, split, seed, weights=dict(weights) if weights else None,
                                   mixed_turns=mixed_turns)]
