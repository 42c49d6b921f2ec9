"""Reading evaluation sets from local files in their public formats (jsonl, jsonl.gz, parquet, csv),
and fetching them from the Hugging Face Hub or ModelScope when a network is there (portachat.storage.hubs:
HF_ENDPOINT, HF_HUB_OFFLINE and PORTACHAT_HUB apply)."""

from __future__ import annotations

import csv
import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from portachat.i18n import _
from portachat.storage import hubs
from portachat.storage.paths import portachat_home

SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".parquet", ".csv")

# Where `--data` defaults to, and the Hub dataset each task comes from (repo, files to fetch).
HUB_SOURCES: dict[str, tuple[str, tuple[str, ...]]] = {
    "gsm8k": ("openai/gsm8k", ("main/test-*.parquet",)),
    "arc": ("allenai/ai2_arc", ("ARC-Challenge/test-*.parquet",)),
    "mmlu": ("cais/mmlu", ("all/test-*.parquet",)),
    "ceval": ("ceval/ceval-exam", ("*/dev-*.parquet", "*/val-*.parquet")),  # test answers are not public
    "cmmlu": ("haonan-li/cmmlu", ("cmmlu_v1_0_1.zip",)),  # the release: dev/ and test/ csv per subject
    "humaneval": ("openai/openai_humaneval", ("openai_humaneval/test-*.parquet",)),
}
# The same sets on ModelScope (the ids evalscope reads); with PORTACHAT_HUB=modelscope. Their folder layouts
# differ from the Hugging Face copies; the readers take any layout, the patterns keep other splits out.
MODELSCOPE_SOURCES: dict[str, tuple[str, tuple[str, ...] | None]] = {
    "gsm8k": ("modelscope/gsm8k", ("*test*",)),
    "arc": ("modelscope/ai2_arc", ("*Challenge*test*",)),
    "mmlu": ("modelscope/mmlu", ("*test*",)),
    "ceval": ("modelscope/ceval-exam", None),  # small; its test split has no answers and is skipped
    "cmmlu": ("modelscope/cmmlu", None),
    "humaneval": ("modelscope/humaneval", None),
}


class EvalDataError(ValueError):
    """Evaluation data that is missing or not in the expected format; the message says what to do."""


def data_files(path: Path) -> list[Path]:
    """The readable files at `path` (a file, or a directory searched recursively), sorted."""
    path = Path(path)
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(SUFFIXES)
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if files:
            return files
        raise EvalDataError(_("{path} holds no {suffixes} files").format(path=path, suffixes="/".join(SUFFIXES)))
    raise EvalDataError(_("no evaluation data at {path}: pass --data FILE_OR_DIR").format(path=path))


def read_rows(path: Path) -> Iterator[dict[str, Any]]:
    """Rows of every file at `path` as dicts; csv files without a header give {"0": ..., "1": ...}."""
    for file in data_files(path):
        name = file.name
        try:
            if name.endswith(".parquet"):
                import pyarrow.parquet as pq  # deferred: slow import, parquet only

                yield from pq.read_table(file).to_pylist()
            elif name.endswith((".jsonl", ".jsonl.gz")):
                opener = gzip.open if name.endswith(".gz") else open
                with opener(file, "rt", encoding="utf-8") as f:
                    for n, line in enumerate(f, start=1):
                        if line.strip():
                            try:
                                yield json.loads(line)
                            except json.JSONDecodeError as exc:
                                raise EvalDataError(_("{where} is not valid JSON ({error})").format(
                                    where=f"{file}:{n}", error=exc)) from None
            elif name.endswith(".json"):
                data = json.loads(file.read_text(encoding="utf-8"))
                yield from (data if isinstance(data, list) else [data])
            else:
                with open(file, newline="", encoding="utf-8") as f:
                    for row in csv.reader(f):
                        yield {str(i): v for i, v in enumerate(row)}
        except (OSError, UnicodeDecodeError, gzip.BadGzipFile) as exc:
            raise EvalDataError(_("cannot read {path}: {error}").format(path=file, error=exc)) from None
        except Exception as exc:  # pyarrow raises its own error types on a damaged parquet file
            if type(exc).__module__.startswith("pyarrow"):
                raise EvalDataError(_("{path} is not a readable parquet file: {error}").format(
                    path=file, error=exc)) from None
            raise


def default_data_path(task: str) -> Path:
    return portachat_home() / "eval_data" / task


def resolve_data(task: str, data: str | Path | None) -> Path:
    """`--data` if given (a path, or `hf:OWNER/NAME[:GLOB]` / `modelscope:OWNER/NAME[:GLOB]` to download);
    else <home>/eval_data/<task>, downloaded from the default hub if absent and online."""

    if data is not None and hubs.has_hub_prefix(str(data)):
        return _download_named(task, str(data))
    if data is not None:
        path = Path(data).expanduser()
        if not path.exists():
            raise EvalDataError(_("--data {path} does not exist").format(path=path))
        return path
    path = default_data_path(task)
    if path.exists() and any(path.rglob("*")):
        return path
    try:
        hub = hubs.default_hub()
    except hubs.HubError as exc:
        raise EvalDataError(str(exc)) from None
    sources = MODELSCOPE_SOURCES if hub == hubs.MODELSCOPE else HUB_SOURCES
    if task not in sources:
        raise EvalDataError(_("no data for {task}: pass --data FILE_OR_DIR").format(task=task))
    repo, patterns = sources[task]
    _download(task, hubs.RepoRef(hub, repo), patterns, path)
    return path


def _download_named(task: str, spec: str) -> Path:
    hub_name, _sep, rest = spec.partition(":")
    repo, _sep, pattern = rest.partition(":")
    if repo.count("/") != 1:
        raise EvalDataError(_("--data {spec}: expected {hub}:OWNER/NAME or {hub}:OWNER/NAME:GLOB").format(
            spec=spec, hub=hub_name))
    ref = hubs.parse_repo(f"{hub_name}:{repo}")
    path = default_data_path(task) / f"{ref.hub}__{repo.replace('/', '__')}"
    if not (path.exists() and any(p.is_file() for p in path.rglob("*") if ".cache" not in p.relative_to(path).parts)):
        _download(task, ref, (pattern,) if pattern else None, path)
    return path


def _download(task: str, ref, patterns: tuple[str, ...] | None, path: Path) -> None:
    try:
        hubs.snapshot(ref, path, repo_type="dataset", allow_patterns=list(patterns) if patterns else None)
    except Exception as exc:  # offline, no access, moved files, no client library: all mean the same to the user
        reason = str(exc) if isinstance(exc, hubs.HubError) else f"{type(exc).__name__}: {exc}"
        raise EvalDataError(
            _("no local data for {task} at {path} and downloading {ref} failed ({reason}). Pass --data FILE_OR_DIR "
              "with the {task} test set in its public format (jsonl, parquet or csv).").format(
                task=task, path=path, ref=ref, reason=reason)
        ) from None
    if not any(p.is_file() for p in path.rglob("*") if ".cache" not in p.relative_to(path).parts):
        raise EvalDataError(_("{ref} has no files matching {patterns} for {task}; pass --data FILE_OR_DIR").format(
            ref=ref, patterns=list(patterns or []), task=task))
