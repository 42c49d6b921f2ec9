"""Starting a stage from saved weights: another stage's (`--init`) or its own (`--resume`, exactly)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from portachat.checkpoint.trainer_state import load_optimizers, load_rng
from portachat.i18n import _
from portachat.model import GPT, GPTConfig
from portachat.model.model_dir import check_tokenizer_matches, load_weights_into, read_config, read_meta
from portachat.tokenizer import Tokenizer
from portachat.train.accumulation import TrainingError
from portachat.train.parallel import load_weights


def load_init_weights(model: GPT, tokenizer: Tokenizer, path: Path) -> dict[str, Any]:
    """Start from another checkpoint's weights (e.g. the previous stage's), without its optimizer state
    or data position. Returns that checkpoint's meta."""
    meta = read_meta(path)
    check_tokenizer_matches(tokenizer, model.config, meta, where=str(path))
    saved_cfg = read_config(path)
    if replace(saved_cfg, max_seq_len=model.config.max_seq_len) != model.config:  # only the context may differ
        raise TrainingError(_("--init {path}: it holds a different model ({saved}) than this stage builds "
                              "({wanted}); pass a checkpoint of this run's model").format(
                                  path=path, saved=saved_cfg, wanted=model.config))
    load_weights_into(model, path)
    return meta


@dataclass(frozen=True)
class Restored:
    """Where a resumed run stands; the RNG state is applied just before training, after anything that
    draws random numbers."""

    step: int
    total_time: float  # seconds trained before
    metrics: dict[str, float]  # measured at the saved step
    rng: dict[str, torch.Tensor] | None  # this rank's


def restore_training_state(path: Path, model: GPT, tokenizer: Any, optimizers: Sequence[torch.optim.Optimizer],
                           scaler: Any, streams: Sequence[Any], stream_offset: int, num_streams: int, rank: int,
                           say: Callable[[str], None],
                           load_model: Callable[[torch.nn.Module, Path], None] | None = None) -> Restored:
    """Load weights, optimizer state (and the fp16 scaler's) and this rank's data positions from `path`.
    `load_model`: how the stage's checkpoints hold the model when not whole (a LoRA run: its adapter)."""
    meta = read_meta(path)
    check_tokenizer_matches(tokenizer, model.config, meta, where=str(path))
    # An adapter checkpoint has no config.json: its portachat.json names the model it was trained on.
    saved_cfg = read_config(path) if load_model is None else GPTConfig.from_dict(meta.get("model_config") or {})
    if saved_cfg != model.config:
        raise TrainingError(
            _("cannot resume from {path}: it holds a different model ({saved}) than this run asks for "
              "({wanted}). Drop --resume or use the same --depth / --max-seq-len as the run you continue.").format(
                path=path, saved=saved_cfg, wanted=model.config)
        )
    if load_model is None:
        load_weights(model, path)  # straight into the training model (its shard under FSDP2): no second copy
    else:
        load_model(model, path)
    # The implementation flags are this device's choice, not the saving machine's (fused AdamW on a
    # CUDA run resumed on a CPU would fail).
    impl = [[{k: g[k] for k in ("fused", "foreach") if k in g} for g in opt.param_groups] for opt in optimizers]
    saved_scaler = load_optimizers(path, model, list(optimizers))
    for opt, groups in zip(optimizers, impl, strict=True):
        for group, flags in zip(opt.param_groups, groups, strict=True):
            group.update(flags)
    if scaler is not None and saved_scaler:
        scaler.load_state_dict(saved_scaler)
    rng = load_rng(path, rank)
    positions = meta.get("data_position", {})
    if positions.get("num_streams") == num_streams:
        for m, stream in enumerate(streams):
            stream.load_state_dict(positions["streams"][str(stream_offset + m)])
    else:
        say(
            "[portachat] " + _("warning: the checkpoint read data as {saved} streams, this run uses {streams} "
                               "(devices x accumulation changed); data restarts at each stream's beginning.").format(
                saved=positions.get("num_streams"), streams=num_streams)
        )
    metrics = meta.get("metrics") or {}
    return Restored(step=int(meta["step"]), total_time=float(metrics.get("total_training_time_s") or 0.0),
                    metrics={k: v for k, v in metrics.items() if k != "total_training_time_s"}, rng=rng)
