"""What a stage gives the Trainer: its data streams, its loss, its evaluators, its optimizers and how
its checkpoints hold the model (the `Stage` hooks). The Trainer owns the step; stages plug in."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from portachat.checkpoint import ModelWriter
from portachat.data.batch import Batch
from portachat.model import GPT


class BatchStream(Protocol):
    def next_batch(self) -> Batch | tuple[torch.Tensor, torch.Tensor]: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...


# (model, batch on the device) -> summed loss over the batch's supervised tokens
LossHook = Callable[[torch.nn.Module, Batch], torch.Tensor]
# (model, step) -> metrics; runs on every rank (collectives allowed), logged by rank 0
Evaluator = Callable[[GPT, int], dict[str, float]]
# (the model, placed and sharded) -> the optimizers that train it
OptimizerHook = Callable[[torch.nn.Module], list[torch.optim.Optimizer]]


@dataclass(frozen=True)
class ModelFiles:
    """How a stage's checkpoints hold the model, when not as a whole HF directory (LoRA: the adapter).
    `gather(model, tokenizer)` runs on every rank (collectives allowed) and returns the writer rank 0
    calls inside the step directory; `load(model, path)` puts a saved checkpoint's values back (resume)."""

    gather: Callable[[torch.nn.Module, Any], ModelWriter]
    load: Callable[[torch.nn.Module, Path], None]


def token_loss(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """Sum of next-token cross-entropies over supervised targets, each times its weight if given
    (RL: the advantage, so the sum is -sum(adv * logprob)); packed rows keep their conversations apart.
    The model computes logits at supervised positions only, in chunks (portachat.model.loss)."""
    extra = {k: v for k, v in (("weights", batch.weights), ("positions", batch.positions),
                               ("supervised", batch.supervised)) if v is not None}
    return model(batch.inputs, batch.targets, loss_reduction="sum", **extra)


def supervised_count(batch: Batch) -> torch.Tensor:
    """What a step's summed loss is divided by, counted over its micro-batches and ranks: supervised tokens."""
    return (batch.targets >= 0).sum()


@dataclass
class Stage:
    """What a stage gives the Trainer."""

    make_stream: Callable[[int, int], BatchStream]  # (stream index, number of streams) -> stream
    # (rank, world) -> validation batches for bits-per-byte over supervised targets; None = no val/bpb
    val_batches: Callable[[int, int], Iterator[tuple[torch.Tensor, torch.Tensor]]] | None = None
    sample_prompts: list[str] = field(default_factory=list)
    loss: LossHook = token_loss
    evaluators: list[Evaluator] = field(default_factory=list)
    # called on every rank after each step's forward/backward; its metrics join the step's log record
    step_metrics: Callable[[], dict[str, float]] | None = None
    # batches made ahead on a background thread (streams of (inputs, targets) that do not read the model)
    prefetch: int = 0
    # (batch on the device) -> the units the loss hook sums over (preference stages: pairs, not tokens)
    count: Callable[[Batch], torch.Tensor] = supervised_count
    # None = Muon for hidden matrices + AdamW for the rest (train/optim.py), sized for training from scratch
    optimizers: OptimizerHook | None = None
    # None = checkpoints hold the whole model (an HF directory)
    model_files: ModelFiles | None = None

