"""GRPO's objective: group-relative advantages, the PPO-style clipped ratio, the k3 KL to a reference.

For each sampled token t of a reply with advantage A (its reward minus its group's mean, optionally
over the group's std), with ratio r = exp(logp - logp_old):

    loss_t = -min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A) + beta * KL_t
    KL_t   = exp(ref - logp) - (ref - logp) - 1          (Schulman's k3 estimator: unbiased, >= 0)

Normalisation is token-level (DAPO; TRL's loss_type="dapo"): the summed loss over every sampled
token of the optimizer step, divided by their global count (the Trainer does that division), so
long and short replies weigh each token alike. One optimizer step per batch of rollouts (TRL's
num_iterations=1) makes logp_old the detached current logp: r = 1 in value, and the gradient is the
policy gradient A * grad logp; the clip matters when the same rollouts are reused.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch

from portachat.data.batch import Batch
from portachat.model import GPT
from portachat.train.lora import adapters_disabled


def group_advantages(rewards: torch.Tensor, normalize_std: bool = False) -> torch.Tensor:
    """rewards [groups, G] -> advantages: reward minus the group mean (over the std if asked)."""
    adv = rewards - rewards.mean(dim=1, keepdim=True)
    if normalize_std:
        adv = adv / (rewards.std(dim=1, keepdim=True) + 1e-6)
    return adv


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token KL(policy || reference) estimate exp(ref - logp) - (ref - logp) - 1."""
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1.0


def clipped_token_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, eps_low: float = 0.2,
                       eps_high: float | None = None, beta: float = 0.0, ref_logp: torch.Tensor | None = None,
                       ) -> torch.Tensor:
    """Per-token GRPO loss (shapes broadcast; mask and normalise outside). eps_high None = eps_low."""
    ratio = torch.exp(logp - old_logp)
    high = eps_low if eps_high is None else eps_high
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + high)
    loss = -torch.min(ratio * advantages, clipped * advantages)
    if beta != 0.0:
        if ref_logp is None:
            raise ValueError("beta != 0 needs the reference model's log-probabilities")
        loss = loss + beta * k3_kl(logp, ref_logp)
    return loss


def token_logprobs(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """log p(target) at every supervised position [B, T] (0 elsewhere), through the chunked loss
    (portachat.model.loss): the head runs on supervised positions only, a chunk at a time."""
    extra = {k: v for k, v in (("positions", batch.positions), ("supervised", batch.supervised)) if v is not None}
    return -model(batch.inputs, batch.targets, loss_reduction="none", **extra)


@dataclass
class GRPOLoss:
    """The Trainer's loss hook for GRPO: the summed per-token loss over the batch's sampled tokens
    (batch.weights holds each token's advantage). `reference`: a frozen model for the KL term, or with
    `reference_is_base` the LoRA model being trained, run with its adapter switched off (no copy)."""

    eps_low: float = 0.2
    eps_high: float | None = None
    beta: float = 0.0
    reference: GPT | None = None
    reference_is_base: bool = False

    def __call__(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        mask = batch.targets >= 0
        ref = None
        if self.beta != 0.0:  # first: switching the adapter off and on again resets its requires_grad
            with torch.no_grad(), adapters_disabled(self.reference) if self.reference_is_base else nullcontext():
                ref = token_logprobs(self.reference, batch).float()
        logp = token_logprobs(model, batch)
        adv = batch.weights if batch.weights is not None else torch.zeros_like(logp)
        loss = clipped_token_loss(logp, logp.detach(), adv, self.eps_low, self.eps_high, self.beta, ref)
        return (loss * mask).sum()
