"""Healing a pruned model: the steps `compress` runs between pruning and measuring.

One interface, `HealStep`: a request (the pruned student, the model it was pruned from, the data and
the budget) in, the healed checkpoint out. Two steps implement it:

  - `distill_heal` (the default, Minitron's heal): the student learns the unpruned teacher's
    next-token distributions on the healing data through the distillation stage (train/distill.py),
    forward KL at temperature 1 over the whole vocabulary and no cross-entropy term, the loss Minitron
    heals with. The teacher knew what the pruned weights did; the labels only say which token came.
  - `finetune_heal`: plain next-token cross-entropy on the same data (train/finetune.py); the
    teacher is not read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from portachat.compress.prune import PruneError
from portachat.device import Device
from portachat.i18n import N_, _
from portachat.train.distill import DistillOptions, run_distill
from portachat.train.distill_loss import DistillLoss
from portachat.train.finetune import FinetuneOptions, run_finetune
from portachat.train.trainer import TrainConfig, TrainResult

HEAL_LR = 1e-4  # a pruned model is far from its optimum: fine-tuning's 2e-5 heals it too slowly
HEAL_RUN = "compress"
HEAL_VAL_CONVERSATIONS = 8
DISTILL_HEAL_LOSS = DistillLoss()  # forward KL, τ = 1, α = 0, whole vocabulary


@dataclass
class HealRequest:
    student: Path  # the pruned checkpoint
    teacher: str  # the model it was pruned from
    data: str  # chat conversations to heal on
    steps: int
    seq_len: int
    device_batch_size: int
    runs_root: Path
    lr: float = HEAL_LR


HealStep = Callable[[HealRequest, Device, Callable[[str], None]], Path]


def _train_config(req: HealRequest) -> TrainConfig:
    return TrainConfig(run=HEAL_RUN, runs_root=str(req.runs_root), device_batch_size=req.device_batch_size,
                       eval_every=0, log_every=max(1, req.steps // 10), warmdown_ratio=0.5)


def _final(result: TrainResult) -> Path:
    if result.final_checkpoint is None:
        raise PruneError(_("the healing run wrote no checkpoint"))
    return result.final_checkpoint


def distill_heal(req: HealRequest, dev: Device, print_fn: Callable[[str], None]) -> Path:
    """Heal by distillation from `req.teacher` on `req.data` (all the student's weights train)."""
    opts = DistillOptions(teacher=req.teacher, student=str(req.student), data=[req.data], loss=DISTILL_HEAL_LOSS,
                          lr=req.lr, num_iterations=req.steps, max_seq_len=req.seq_len,
                          val_conversations=HEAL_VAL_CONVERSATIONS, train=_train_config(req))
    return _final(run_distill(opts, dev=dev, print_fn=print_fn))


def finetune_heal(req: HealRequest, dev: Device, print_fn: Callable[[str], None]) -> Path:
    """Heal by next-token cross-entropy on `req.data` (full fine-tuning); the teacher is not read."""
    opts = FinetuneOptions(init=str(req.student), stage="sft", data=[req.data], lr=req.lr, num_iterations=req.steps,
                           max_seq_len=req.seq_len, eval_examples=0, val_conversations=HEAL_VAL_CONVERSATIONS,
                           train=_train_config(req))
    return _final(run_finetune(opts, dev=dev, print_fn=print_fn))


# --heal NAME -> the step, and how the report names what it did ({steps}, {teacher}, {data} filled in)
HEALS: dict[str, HealStep] = {"distill": distill_heal, "sft": finetune_heal}
HEAL_NOTES = {
    "distill": N_("healing: {steps} steps of distillation from {teacher} (forward KL on its next-token "
                  "distributions) on {data}"),
    "sft": N_("healing: {steps} steps of next-token cross-entropy on {data}"),
}
