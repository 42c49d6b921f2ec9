"""Preference losses: DPO (sigmoid), IPO, SimPO, ORPO, on per-sequence log-probs of the replies.

`sequence_logps` scores rows through the model's chunked loss (portachat.model.loss, reduction "none"):
logits only at supervised positions, a chunk at a time, so no [tokens x vocab] fp32 tensor exists whole.
A row's log-prob is the sum over its supervised targets (the reply's tokens).

With c/r the policy's summed log-probs of the chosen/rejected reply, c0/r0 the reference's, |y| a reply's
token count and beta the strength:
  dpo    -log sigmoid(beta * ((c - c0) - (r - r0)))                      Rafailov et al. 2023 (TRL "sigmoid")
  ipo    ((c - c0)/|yc| - (r - r0)/|yr| - 1/(2 beta))^2                  Azar et al. 2023, per-token as TRL
  simpo  -log sigmoid(beta * (c/|yc| - r/|yr|) - gamma)                  Meng et al. 2024 (no reference)
  orpo   -c/|yc| - beta * log sigmoid(log odds(yc) - log odds(yr)),     Hong et al. 2024 (no reference),
         log odds(y) = a - log(1 - e^a), a = mean log-prob of y's tokens  beta is the paper's lambda
Rewards (what TRL logs): beta * (c - c0) and beta * (r - r0) for DPO and IPO; beta times the mean
log-prob per token for SimPO and ORPO (as TRL's CPO and ORPO trainers log them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from portachat.data.batch import Batch
from portachat.device import DistEnv
from portachat.train.collectives import SINGLE_PROCESS, sum_over_ranks

LOSSES = ("dpo", "ipo", "simpo", "orpo")
NEEDS_REFERENCE = ("dpo", "ipo")
DEFAULT_BETA = {"dpo": 0.1, "ipo": 0.1, "simpo": 2.0, "orpo": 0.1}  # TRL's defaults (SimPO: the paper's)
SIMPO_GAMMA = 0.5  # SimPO's target margin gamma (TRL's CPO default simpo_gamma)


def sequence_logps(model: torch.nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed log-prob of each row's supervised targets [R], their count [R]) through the chunked loss."""
    extra = {k: v for k, v in (("positions", batch.positions), ("supervised", batch.supervised)) if v is not None}
    per_token = model(batch.inputs, batch.targets, loss_reduction="none", **extra)  # [R, T] cross-entropies
    return -per_token.sum(dim=1), (batch.targets >= 0).sum(dim=1)


@dataclass
class PairScores:
    losses: torch.Tensor  # [P] per-pair loss (differentiable)
    chosen_rewards: torch.Tensor  # [P] detached
    rejected_rewards: torch.Tensor  # [P] detached


def preference_loss(kind: str, beta: float, chosen: torch.Tensor, rejected: torch.Tensor,
                    chosen_len: torch.Tensor, rejected_len: torch.Tensor, ref_chosen: torch.Tensor | None = None,
                    ref_rejected: torch.Tensor | None = None, gamma: float = SIMPO_GAMMA) -> PairScores:  # fmt: skip
    """Per-pair losses and rewards; chosen/rejected are summed log-probs [P], *_len the reply token counts."""
    if kind not in LOSSES:
        raise ValueError(f"unknown preference loss {kind!r}: expected one of {', '.join(LOSSES)}")
    chosen_len = chosen_len.to(chosen.dtype).clamp(min=1.0)
    rejected_len = rejected_len.to(rejected.dtype).clamp(min=1.0)
    if kind in NEEDS_REFERENCE:
        if ref_chosen is None or ref_rejected is None:
            raise ValueError(f"the {kind} loss needs the reference model's log-probs")
        chosen_ratio, rejected_ratio = chosen - ref_chosen, rejected - ref_rejected
        if kind == "dpo":
            losses = -F.logsigmoid(beta * (chosen_ratio - rejected_ratio))
        else:
            losses = (chosen_ratio / chosen_len - rejected_ratio / rejected_len - 1.0 / (2.0 * beta)) ** 2
        return PairScores(losses, beta * chosen_ratio.detach(), beta * rejected_ratio.detach())
    chosen_mean, rejected_mean = chosen / chosen_len, rejected / rejected_len
    if kind == "simpo":
        losses = -F.logsigmoid(beta * (chosen_mean - rejected_mean) - gamma)
    else:  # orpo: log odds = a - log(1 - exp(a)), a <= 0 the mean log-prob
        log_odds = (chosen_mean - rejected_mean) - (torch.log1p(-torch.exp(chosen_mean))
                                                    - torch.log1p(-torch.exp(rejected_mean)))
        losses = -chosen_mean - beta * F.logsigmoid(log_odds)
    return PairScores(losses, beta * chosen_mean.detach(), beta * rejected_mean.detach())


class PreferenceMetrics:
    """Sums of TRL's logged quantities over a step's micro-batches, read (all ranks reduced) once per step."""

    NAMES = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
             "logps/rejected")

    def __init__(self, device: torch.device, dtype: torch.dtype = torch.float32, env: DistEnv = SINGLE_PROCESS) -> None:
        self.device, self.dtype, self.env = device, dtype, env
        self.sums: torch.Tensor | None = None

    def add(self, scores: PairScores, chosen: torch.Tensor, rejected: torch.Tensor) -> None:
        c, r = scores.chosen_rewards, scores.rejected_rewards
        values = torch.stack([c.sum(), r.sum(), (c > r).float().sum(), (c - r).sum(), chosen.detach().sum(),
                              rejected.detach().sum(), torch.tensor(float(c.numel()), device=c.device)])
        values = values.to(self.dtype)
        self.sums = values if self.sums is None else self.sums + values

    def read(self) -> dict[str, float]:
        sums = self.sums if self.sums is not None else torch.zeros(len(self.NAMES) + 1, dtype=self.dtype,
                                                                    device=self.device)
        *totals, pairs = sum_over_ranks(sums.to(self.device), self.env).tolist()
        self.sums = None
        return {name: total / max(pairs, 1.0) for name, total in zip(self.NAMES, totals, strict=True)}
