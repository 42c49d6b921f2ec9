"""Distillation losses: the student's next-token distribution pulled toward the teacher's.

Per supervised token, with p = softmax(teacher / τ), q = softmax(student / τ):

    loss = τ² · D_β(p, q) + α · w · CE(student, label)

  - D_β is GKD's generalized Jensen-Shannon divergence (Agarwal et al. 2023, TRL's
    `generalized_jsd_loss`): β = 0 is forward KL(p ‖ q) (Hinton et al.'s distillation loss: with α
    it is the textbook "KL at temperature τ times τ² plus α times cross-entropy"), β = 1 reverse
    KL(q ‖ p) (mode-seeking), 0 < β < 1 the β-mixture JSD. TRL's convention: the mixture is
    m = β·p + (1-β)·q and D_β = β·KL(p ‖ m) + (1-β)·KL(q ‖ m).
  - τ² keeps the gradient's size independent of τ (soft targets' gradients shrink as 1/τ²).
  - CE is the plain cross-entropy at temperature 1 on the data's labels, each token weighted by w
    (1 on the data; 0 on the student's own on-policy samples, which are no labels).

Top-k teacher: storing or sending the teacher's whole distribution costs a vocabulary of floats per
token (49k for SmolLM2), so the teacher gives its k most likely ids and their log-probabilities. Both
distributions are then compared on k + 1 outcomes: the k ids and "any other token" (the tail), whose
mass is 1 - Σ p over the k ids for the teacher and 1 - Σ q over the same ids for the student. This is
the exact divergence of the two distributions coarse-grained to those outcomes: never above the full
divergence (data processing), equal to it once the tail holds no teacher mass, and the student's
mass outside the k ids is still charged through the tail. Renormalising both over the k ids instead
would let the student put mass anywhere outside them for free.

Memory: the student's logits exist a chunk of supervised positions at a time (model/loss.py's chunk
size), and under activation checkpointing when there are several chunks, so the fp32
[tokens x vocabulary] tensor never exists whole. A whole-vocabulary teacher in this process gives its
final hidden states at the supervised positions ([N x d], small) and its head: its log-probabilities are
computed in the same chunk loop, without gradients, and recomputed with the student's chunk in the
backward, so no teacher tensor of [N x vocabulary] exists either (top-k targets are [N x k]: kept).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from portachat.i18n import _

LOSSES = {"kl": 0.0, "forward-kl": 0.0, "reverse-kl": 1.0, "jsd": 0.5}  # --loss names -> β (jsd: --beta overrides)
TAIL_FLOOR = -1e-30  # log Σ over the k ids is kept below 0 so the tail's log-mass stays finite (and its gradient)


@dataclass(frozen=True)
class DistillLoss:
    beta: float = 0.0  # GKD's β: 0 forward KL, 1 reverse KL, between: generalized JSD
    temperature: float = 1.0  # τ
    alpha: float = 0.0  # weight of the cross-entropy on the data's labels
    top_k: int | None = None  # teacher ids per token; None = the whole vocabulary

    def check(self) -> None:
        if not 0.0 <= self.beta <= 1.0:
            raise ValueError(_("--beta must be between 0 (forward KL) and 1 (reverse KL), got {value}").format(
                value=self.beta))
        if not self.temperature > 0 or not math.isfinite(self.temperature):
            raise ValueError(_("--temperature must be a positive number, got {value}").format(value=self.temperature))
        if self.alpha < 0:
            raise ValueError(_("--alpha (the cross-entropy weight) must be 0 or more, got {value}").format(
                value=self.alpha))
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(_("--top-k must be at least 1, got {value}").format(value=self.top_k))


@dataclass
class TeacherTargets:
    """The teacher's side for N supervised positions, in one of two forms:
      - log-probabilities at temperature τ: over the whole vocabulary (ids None, logprobs [N, V]) or its
        top k (ids [N, k] int64, logprobs [N, k]);
      - its final hidden states (hidden [N, d]) and output head, from which `resolved` computes those
        log-probabilities a chunk of rows at a time (an in-process teacher: [N, V] never exists whole)."""

    logprobs: torch.Tensor | None = None
    ids: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    head: Callable[[torch.Tensor], torch.Tensor] | None = None

    def rows(self, start: int, stop: int) -> TeacherTargets:
        def cut(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[start:stop]

        return TeacherTargets(cut(self.logprobs), cut(self.ids), cut(self.hidden), self.head)

    def resolved(self, temperature: float, top_k: int | None) -> TeacherTargets:
        """The log-probability form (this one, or the head run on the hidden states, without gradients).
        Call it on a chunk of rows: on all N at once it is the [N, V] tensor the hidden form avoids."""
        if self.hidden is None:
            return self
        with torch.no_grad():
            return teacher_targets(self.head(self.hidden), temperature, top_k)


def generalized_jsd(student: torch.Tensor, teacher: torch.Tensor, beta: float) -> torch.Tensor:
    """D_β per row [N] for log-probabilities [N, V] (any number of outcomes), as TRL computes it."""
    if beta == 0.0:
        div = F.kl_div(student, teacher, reduction="none", log_target=True)  # KL(teacher ‖ student)
    elif beta == 1.0:
        div = F.kl_div(teacher, student, reduction="none", log_target=True)  # KL(student ‖ teacher)
    else:
        mixture = torch.logsumexp(torch.stack([student + math.log1p(-beta), teacher + math.log(beta)]), dim=0)
        div = beta * F.kl_div(mixture, teacher, reduction="none", log_target=True) \
            + (1 - beta) * F.kl_div(mixture, student, reduction="none", log_target=True)
    return div.sum(-1)


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x < 0, accurate at both ends (Mächler 2012), with finite gradients."""
    x = x.clamp(max=TAIL_FLOOR)
    near = x.clamp(min=-math.log(2.0))  # each branch on inputs where it is accurate: no inf in either
    far = x.clamp(max=-math.log(2.0))
    return torch.where(x > -math.log(2.0), torch.log(-torch.expm1(near)), torch.log1p(-torch.exp(far)))


def with_tail(logprobs_at_ids: torch.Tensor) -> torch.Tensor:
    """[N, k] log-probabilities of k ids -> [N, k + 1]: the ids, then "any other token"."""
    tail = log1mexp(torch.logsumexp(logprobs_at_ids, dim=-1, keepdim=True))
    return torch.cat([logprobs_at_ids, tail], dim=-1)


def teacher_targets(logits: torch.Tensor, temperature: float, top_k: int | None) -> TeacherTargets:
    """The teacher's side for logits [N, V]: log-softmax at τ, whole or its top k."""
    logprobs = F.log_softmax(logits.float() / temperature, dim=-1)
    if top_k is None or top_k >= logprobs.size(-1):
        return TeacherTargets(logprobs)
    values, ids = logprobs.topk(top_k, dim=-1)
    return TeacherTargets(values, ids)


def token_divergence(student_logits: torch.Tensor, teacher: TeacherTargets, loss: DistillLoss) -> torch.Tensor:
    """τ² · D_β per position [N] for student logits [N, V] against the teacher's targets."""
    student = F.log_softmax(student_logits.float() / loss.temperature, dim=-1)
    teacher = teacher.resolved(loss.temperature, loss.top_k)
    if teacher.ids is None:
        div = generalized_jsd(student, teacher.logprobs.float(), loss.beta)
    else:
        div = generalized_jsd(with_tail(student.gather(-1, teacher.ids)), with_tail(teacher.logprobs.float()), loss.beta)
    return div * loss.temperature**2


def token_loss(student_logits: torch.Tensor, teacher: TeacherTargets, labels: torch.Tensor,
               ce_weights: torch.Tensor | None, loss: DistillLoss) -> torch.Tensor:  # fmt: skip
    """The whole per-position loss [N]: τ² · D_β + α · w · CE."""
    per_token = token_divergence(student_logits, teacher, loss)
    if loss.alpha > 0:
        ce = F.cross_entropy(student_logits.float(), labels, reduction="none")
        per_token = per_token + loss.alpha * (ce if ce_weights is None else ce * ce_weights.float())
    return per_token


def distill_loss_sum(hidden: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor], teacher: TeacherTargets,
                     labels: torch.Tensor, ce_weights: torch.Tensor | None, loss: DistillLoss, chunk: int
                     ) -> torch.Tensor:  # fmt: skip
    """Σ over N supervised positions of the per-token loss, from the student's hidden states [N, C] and
    output head, `chunk` positions at a time (recomputed in backward when there are several). A teacher
    given as hidden states runs its head inside the same chunk (and its recomputation): only its [N, d]
    hidden states are held for the backward, never its [N, V] log-probabilities."""
    n = hidden.size(0)
    recompute = n > chunk and torch.is_grad_enabled()
    total = hidden.new_zeros((), dtype=torch.float32)

    def piece(h: torch.Tensor, lab: torch.Tensor, w: torch.Tensor | None, t: TeacherTargets) -> torch.Tensor:
        return token_loss(head(h), t, lab, w, loss).sum()

    for start in range(0, n, chunk):
        stop = start + chunk
        args = (hidden[start:stop], labels[start:stop], None if ce_weights is None else ce_weights[start:stop],
                teacher.rows(start, stop))
        total = total + (checkpoint(piece, *args, use_reentrant=False) if recompute else piece(*args))
    return total
