"""The teacher of a distillation run: a model in this process that scores each micro-batch.

It runs the batch's rows once (no gradients, eval mode, in the dtype it was loaded in) and returns its
log-probabilities at the loss's temperature for the supervised positions only: the whole vocabulary,
or its top k (distill_loss.py says how the rest is handled), a chunk of positions at a time, so its
fp32 [tokens x vocabulary] logits never exist whole either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from portachat.data.batch import Batch
from portachat.engine.speculative.vocabulary import vocabulary_difference
from portachat.i18n import _
from portachat.model import GPT
from portachat.model.loss import loss_chunk_size
from portachat.train.accumulation import TrainingError
from portachat.train.distill_loss import DistillLoss, TeacherTargets, teacher_targets


def supervised_indices(batch: Batch) -> torch.Tensor:
    """Flat indices of the batch's supervised targets (found on the host by Batch.to when it could)."""
    if batch.supervised is not None:
        return batch.supervised
    return (batch.targets.reshape(-1) >= 0).nonzero().squeeze(1)


@dataclass
class InProcessTeacher:
    model: GPT  # eval mode, on the training device
    name: str

    def __post_init__(self) -> None:
        self.model.eval().requires_grad_(False)
        self.chunk = loss_chunk_size(self.model.config.vocab_size)

    @torch.no_grad()
    def targets(self, batch: Batch, loss: DistillLoss) -> TeacherTargets:
        hidden = self.model.hidden_states(batch.inputs, batch.positions)
        picked = hidden.reshape(-1, hidden.size(-1)).index_select(0, supervised_indices(batch))
        pieces = [teacher_targets(self.model.lm_head(picked[s : s + self.chunk]), loss.temperature, loss.top_k)
                  for s in range(0, picked.size(0), self.chunk)]
        if not pieces:
            return teacher_targets(self.model.lm_head(picked), loss.temperature, loss.top_k)
        ids = None if pieces[0].ids is None else torch.cat([p.ids for p in pieces])
        return TeacherTargets(torch.cat([p.logprobs for p in pieces]), ids)


def check_shared_vocabulary(teacher: GPT, teacher_tokenizer: Any, teacher_name: str, student: GPT,
                            student_tokenizer: Any, student_name: str) -> None:  # fmt: skip
    """Refuse a student that does not speak the teacher's token ids, naming both models and sizes."""
    found = vocabulary_difference(teacher, teacher_tokenizer, student, student_tokenizer)
    if found is None:
        return
    if found.token_id is not None:
        detail = _("token {id} is {teacher_spelling} in the teacher and {student_spelling} in the student").format(
            id=found.token_id, teacher_spelling=repr(found.spellings[0]), student_spelling=repr(found.spellings[1]))
    else:
        detail = _("their tokenizers hold {teacher_tokens} and {student_tokens} tokens").format(
            teacher_tokens=found.tokens[0], student_tokens=found.tokens[1])
    raise TrainingError(_(
        "the teacher {teacher} (vocabulary of {teacher_vocab}) and the student {student} (vocabulary of {student_vocab}) "
        "do not "
        "share a vocabulary ({detail}). Distillation compares their next-token distributions token id by token "
        "id: pick a student of the teacher's family and tokenizer, or build one from the teacher with "
        "--student-depth N.").format(teacher=teacher_name, teacher_vocab=found.rows[0], student=student_name,
                                     student_vocab=found.rows[1], detail=detail))
