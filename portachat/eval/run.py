"""`portachat eval`'s library side: load a model once, run the chosen evaluations, return results.

Generative tasks go through the inference engine (batched), categorical ones through one forward
pass per question, bits-per-byte through the model's loss. "all" runs every task whose data is
present locally (the synthetic held-out set and bits-per-byte on the synthetic curriculum always;
C-Eval and CMMLU when their data is under <home>/eval_data)
and adds the CORE-style centred mean.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from portachat.data.sources import open_source
from portachat.device import get_device
from portachat.engine.loading import LoadOptions, engine_for_model, load_served_model
from portachat.eval.bpb import evaluate_bpb
from portachat.eval.chinese_mc import evaluate_chinese_mc, read_chinese_mc
from portachat.eval.core import core_score
from portachat.eval.data_files import EvalDataError, default_data_path, resolve_data
from portachat.eval.generation import engine_complete
from portachat.eval.gsm8k import evaluate_gsm8k, read_gsm8k
from portachat.eval.humaneval import evaluate_humaneval, read_humaneval
from portachat.eval.multiple_choice import evaluate_multiple_choice, read_arc, read_mmlu
from portachat.eval.report import EvalResult
from portachat.eval.sandbox import SandboxLimits, SandboxUnavailable, require_isolation
from portachat.eval.synthetic import evaluate_synthetic
from portachat.eval.tasks import CHOICES, TASKS
from portachat.i18n import _
from portachat.model.load import load_for_inference

MAX_EVAL_CONTEXT = 2048


@dataclass
class EvalOptions:
    task: str  # one of CHOICES
    model: str
    data: str | None = None  # the task's data (file or directory); None = default location
    limit: int | None = None  # questions per task (rows of text for bpb)
    device: str | None = None
    dtype: str | None = None
    max_tokens: int | None = None  # per reply; None = each task's default
    seed: int = 0
    workers: int | None = None  # HumanEval sandboxes at a time
    quantize: str | None = None  # "int8" / "int4" weight-only, as the device layer plans it
    shots: int = 5  # C-Eval / CMMLU examples from the dev split before each question
    tensor_parallel_size: int = 1  # generative tasks only: the engine over N worker processes
    allow_unsandboxed_code: bool = False  # HumanEval where the sandbox has no namespaces (--allow-unsandboxed-code)


FORWARD_TASKS = ("bpb", "arc", "mmlu")  # scored from the model's own forward, on one device


def _task_list(opts: EvalOptions) -> list[str]:
    if opts.task not in CHOICES:
        raise EvalDataError(_("unknown evaluation {task}; choose one of {choices}").format(
            task=repr(opts.task), choices=", ".join(CHOICES)))
    if opts.task in ("all", "core"):
        if opts.data is not None:
            raise EvalDataError(_("--data names one task's data; use it with a single task (e.g. `portachat eval "
                                  "gsm8k --data test.jsonl`). `all` reads each task's data from {path}").format(
                path=default_data_path("<task>")))
        return list(TASKS)
    return [opts.task]


def token_bytes_tensor(tokenizer: Any, vocab_size: int) -> torch.Tensor:
    """int64 [vocab_size]: the bytes each token spells (0 for control and padding ids)."""
    n = tokenizer.vocab_size
    return torch.tensor([len(tokenizer.token_bytes(i)) if i < n else 0 for i in range(vocab_size)], dtype=torch.long)


def text_bpb(model: torch.nn.Module, tokenizer: Any, data: str | None, limit: int | None,
             batch_size: int = 8) -> EvalResult:
    """Bits per byte on the validation split of `data` (default: the built-in synthetic curriculum)."""
    seq_len = min(512, model.config.max_seq_len)
    rows_wanted = limit or 64
    source = open_source(data, split="val")
    stream: list[int] = []
    rows: list[list[int]] = []
    for doc in source.iter_documents():
        bos = [tokenizer.bos_id] if tokenizer.bos_id is not None else []
        stream.extend(bos + tokenizer.encode(doc))
        while len(stream) >= seq_len + 1 and len(rows) < rows_wanted:
            rows.append(stream[:seq_len + 1])
            stream = stream[seq_len:]
        if len(rows) >= rows_wanted:
            break
    if not rows and len(stream) > 1:
        rows.append(stream)
    if not rows:
        raise EvalDataError(_("{source} gave no validation text for bits per byte").format(
            source=data or _("the synthetic curriculum")))
    device = next(model.parameters()).device
    batches = [(torch.tensor([r[:-1]]), torch.tensor([r[1:]])) for r in rows]
    table = token_bytes_tensor(tokenizer, model.config.vocab_size)

    value = evaluate_bpb(model, batches, table, device, nullcontext)
    nbytes = int(sum(table[torch.tensor(r[1:])].sum() for r in rows))
    return EvalResult("bpb", "bits_per_byte", value, nbytes, None,
                      {"data": str(data or "synthetic"), "rows": len(rows), "seq_len": seq_len})


def run_evals(opts: EvalOptions, log: Callable[[str], None] = print) -> list[EvalResult]:
    tasks = _task_list(opts)
    single = len(tasks) == 1
    data: dict[str, Path | None] = {}
    for task in tasks:  # find all data before loading the model: a typo should fail in a second
        if task == "synthetic":
            if opts.data:
                raise EvalDataError(_("the synthetic held-out set is built in: drop --data"))
            data[task] = None
        elif task == "bpb":
            data[task] = Path(opts.data) if opts.data else None
            if opts.data and not Path(opts.data).exists() and str(opts.data) != "synthetic":
                raise EvalDataError(_("--data {path} does not exist").format(path=opts.data))
        elif single:
            data[task] = resolve_data(task, opts.data)
        else:
            path = default_data_path(task)
            if path.exists() and any(path.rglob("*")):
                data[task] = path
            else:
                log("[eval] " + _("{task}: skipped, no data at {path} (`portachat eval {task}` downloads it when "
                                  "online, or pass --data)").format(task=task, path=path))
    if "humaneval" in data and not _sandbox_ready(opts, single, log):
        del data["humaneval"]
    if opts.tensor_parallel_size > 1:
        return _run_tensor_parallel(opts, tasks, data, log)
    loaded = load_for_inference(opts.model, device=opts.device, dtype=opts.dtype)
    complete, description = _make_complete(loaded, opts)  # quantizes the model in place with --quantize
    log("[eval] " + _("model: {description}").format(description=description))
    model, tokenizer = loaded.model, loaded.tokenizer
    results: list[EvalResult] = []
    for task in tasks:
        if task not in data:
            continue
        log(f"[eval] {task} ...")
        results.append(_run_one(task, data[task], model, tokenizer, complete, opts))
    if opts.task in ("all", "core"):
        results.append(core_score(results))
    return results


def _sandbox_ready(opts: EvalOptions, single: bool, log: Callable[[str], None]) -> bool:
    """Before loading the model: can HumanEval's programs run here? Alone it fails with the reason,
    within `all` it is skipped with it."""
    try:
        require_isolation(SandboxLimits(allow_unsandboxed=opts.allow_unsandboxed_code))
    except SandboxUnavailable as exc:
        if single:
            raise
        log(_("[eval] humaneval: skipped: {reason}").format(reason=exc))
        return False
    return True


def _run_tensor_parallel(opts: EvalOptions, tasks: list[str], data: dict[str, Path | None],
                         log: Callable[[str], None]) -> list[EvalResult]:  # fmt: skip
    """Generative tasks through an engine split over -tp N worker processes (started and stopped here)."""
    forward = [t for t in tasks if t in FORWARD_TASKS and t in data]
    if forward:
        raise EvalDataError(_("{tasks} score the model's own forward on one device: run them without "
                              "--tensor-parallel-size (it applies to the generative tasks: synthetic, gsm8k, "
                              "humaneval)").format(tasks=", ".join(forward)))
    served = load_served_model(LoadOptions(model=opts.model, device=opts.device, dtype=opts.dtype,
                                           quantize=opts.quantize, max_model_len=MAX_EVAL_CONTEXT,
                                           tensor_parallel_size=opts.tensor_parallel_size))  # fmt: skip
    try:
        log("[eval] " + _("model: {description}").format(description=served.description))
        complete = engine_complete(served.engine, served.tokenizer, seed=opts.seed)
        results = []
        for task in tasks:
            if task in data:
                log(f"[eval] {task} ...")
                results.append(_run_one(task, data[task], None, served.tokenizer, complete, opts))
        return results
    finally:
        if served.close is not None:
            served.close()


def _make_complete(loaded: Any, opts: EvalOptions) -> tuple[Callable, str]:
    """The generative tasks' complete function over the loaded model, through the engine builder
    the server uses, and the model's description."""
    dev = get_device(kind=opts.device, dtype=opts.dtype)
    # Eval prompts are short (HumanEval's longest ~1k tokens with its reply): no need to reserve a KV
    # cache for a model's full context (8k for SmolLM2) times the batch.
    options = LoadOptions(model=opts.model, device=opts.device, dtype=opts.dtype, quantize=opts.quantize,
                          max_model_len=min(loaded.model.config.max_seq_len, MAX_EVAL_CONTEXT))
    engine, tokenizer, description = engine_for_model(loaded, options, dev)
    return engine_complete(engine, tokenizer, seed=opts.seed), description


def _run_one(task: str, data: Path | None, model, tokenizer, complete, opts: EvalOptions) -> EvalResult:
    kw = {} if opts.max_tokens is None else {"max_tokens": opts.max_tokens}
    if task == "bpb":
        return text_bpb(model, tokenizer, str(data) if data else None, opts.limit)
    if task == "synthetic":
        return evaluate_synthetic(complete, n=opts.limit or 200, seed=opts.seed, **kw)
    if task == "gsm8k":
        return evaluate_gsm8k(complete, read_gsm8k(data, opts.limit), **kw)
    if task in ("arc", "mmlu"):
        questions = (read_arc if task == "arc" else read_mmlu)(data, opts.limit)
        return evaluate_multiple_choice(task, model, tokenizer, questions)
    if task in ("ceval", "cmmlu"):
        return evaluate_chinese_mc(read_chinese_mc(task, data, opts.limit), model, tokenizer, shots=opts.shots)

    return evaluate_humaneval(complete, read_humaneval(data, opts.limit), workers=opts.workers,
                              limits=SandboxLimits(allow_unsandboxed=opts.allow_unsandboxed_code), **kw)
