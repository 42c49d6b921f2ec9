"""`portachat prune`: load a model, measure importance on calibration data, prune, write an HF
directory of the same family (through the one model-directory writer, atomically)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from portachat.compress.calibration import calibration_batches, calibration_tokens
from portachat.compress.importance import DEPTH_METRICS, Importance, measure_importance
from portachat.compress.prune import PruneError, PrunePlan, PruneTargets, prune_model, pruned_config
from portachat.compress.unstructured import PATTERNS, SparsityReport, check_amount, sparsify_
from portachat.device import Device, get_device
from portachat.i18n import _
from portachat.model.gpt import GPT
from portachat.model.model_dir import save_model_files
from portachat.storage.atomic import atomic_directory
from portachat.train.base_model import BaseModel, load_base


@dataclass
class PruneOptions:
    model: str  # anything model.source.resolve accepts: our checkpoint, an HF directory, a .gguf
    output: str
    targets: PruneTargets = field(default_factory=PruneTargets)
    data: str | None = None  # calibration data: a text file or a chat dataset; needed for structured pruning
    calibration_samples: int = 32
    seq_len: int = 256
    depth_metric: str = "loss"
    unstructured: float | None = None  # fraction of block weights to zero by magnitude
    sparsity_pattern: str = "unstructured"  # or "2:4"


@dataclass
class PruneResult:
    path: Path
    params_before: int
    params_after: int
    config_before: dict[str, Any]
    config_after: dict[str, Any]
    plan: PrunePlan | None
    importance: Importance | None
    sparsity: SparsityReport | None
    seconds: float


def check_options(opts: PruneOptions) -> None:
    """Everything that can be refused without reading the model."""
    if not opts.targets.any() and opts.unstructured is None and opts.sparsity_pattern != "2:4":
        raise PruneError(_("nothing to prune: pass a target (--target-num-layers, --target-ffn-hidden-size, "
                           "--target-num-attention-heads, --target-num-query-groups, --target-hidden-size), "
                           "--unstructured FRACTION or --sparsity-pattern 2:4"))
    if opts.targets.any() and not opts.data:
        raise PruneError(_("structured pruning measures importance on calibration data: pass --data FILE (a text "
                           "file or a chat .jsonl)"))
    if opts.depth_metric not in DEPTH_METRICS:
        raise PruneError(_("--depth-metric must be one of {choices}").format(choices=", ".join(DEPTH_METRICS)))
    if opts.sparsity_pattern not in PATTERNS:
        raise PruneError(_("--sparsity-pattern must be one of {choices}").format(choices=", ".join(PATTERNS)))
    if opts.unstructured is not None and opts.sparsity_pattern == "2:4":
        raise PruneError(_("--unstructured FRACTION and --sparsity-pattern 2:4 are two different patterns (2:4 is "
                           "always 50%); pass one of them"))
    if opts.unstructured is not None:
        try:
            check_amount(opts.unstructured)
        except ValueError as exc:
            raise PruneError(str(exc)) from None
    check_output_free(Path(opts.output).expanduser())


def check_output_free(output: Path) -> None:
    if output.exists():
        raise PruneError(_("{path} already exists; pass a new --output path or remove the old one first").format(
            path=output))
    if not output.parent.is_dir():
        raise PruneError(_("the parent directory of --output {path} does not exist; create it first").format(
            path=output))


def calibration_for(base: BaseModel, spec: str, samples: int, seq_len: int, skip: int = 0) -> list[torch.Tensor]:
    """`samples` rows of `seq_len` + 1 tokens of `spec`, tokenised as `base` reads text."""
    encode = base.tokenizer.encode
    ids = calibration_tokens(spec, encode, base.render, (skip + samples) * (seq_len + 1))
    return calibration_batches(ids, samples, seq_len, skip=skip)


def prune_loaded(model: GPT, opts: PruneOptions, batches: list[torch.Tensor] | None
                 ) -> tuple[GPT, PrunePlan | None, Importance | None, SparsityReport | None]:  # fmt: skip
    """Structured pruning (when targets are given) then sparsity (when asked), on a model in memory."""
    plan = importance = sparsity = None
    if opts.targets.any():
        importance = measure_importance(model, batches or [], opts.depth_metric)
        model, plan = prune_model(model, importance, opts.targets, opts.depth_metric)
    if opts.unstructured is not None or opts.sparsity_pattern == "2:4":
        sparsity = sparsify_(model, opts.unstructured or 0.5, opts.sparsity_pattern)
    return model, plan, importance, sparsity


def run_prune(opts: PruneOptions, dev: Device | None = None, print_fn: Callable[[str], None] = print) -> PruneResult:
    check_options(opts)
    started = time.perf_counter()
    dev = dev or get_device()
    base = load_base(opts.model, dev)
    model = base.model
    model.requires_grad_(False)
    before = model.config
    pruned_config(before, opts.targets)  # impossible targets fail before calibration
    batches = None
    if opts.targets.any():
        batches = calibration_for(base, str(opts.data), opts.calibration_samples, opts.seq_len)
        print_fn("[portachat] prune: " + _("measuring importance on {rows} calibration rows of {tokens} tokens "
                                           "(depth metric: {metric})").format(
            rows=opts.calibration_samples, tokens=opts.seq_len, metric=opts.depth_metric))
    params_before = model.num_params()
    model, plan, importance, sparsity = prune_loaded(model, opts, batches)
    if sparsity is not None:
        print_fn("[portachat] prune: " + sparsity.summary())
    meta = {"stage": "prune", "pruned_from": str(base.path),
            "pruning": {"targets": asdict(opts.targets), "depth_metric": opts.depth_metric,
                        "kept_layers": plan.layers if plan else None,
                        "calibration": {"data": opts.data, "samples": opts.calibration_samples, "seq_len": opts.seq_len},
                        "base_loss": importance.base_loss if importance else None,
                        "sparsity": None if sparsity is None else {"pattern": sparsity.pattern,
                                                                   "block_weights": sparsity.sparsity,
                                                                   "all_parameters": sparsity.model_sparsity}}}
    output = Path(opts.output).expanduser()
    with atomic_directory(output) as tmp:
        save_model_files(tmp, model, base.tokenizer, meta, generation_defaults=base.generation)
    result = PruneResult(path=output, params_before=params_before, params_after=model.num_params(),
                         config_before=before.to_dict(), config_after=model.config.to_dict(), plan=plan,
                         importance=importance, sparsity=sparsity, seconds=time.perf_counter() - started)
    print_fn("[portachat] prune: " + _("{before:,} -> {after:,} parameters ({layers} layers); wrote {path}").format(
        before=result.params_before, after=result.params_after, layers=model.config.n_layer, path=output))
    return result
