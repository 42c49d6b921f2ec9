"""DPO, IPO, SimPO and ORPO against their published formulas, computed by hand on scalars; per-sequence
log-probs through the chunked loss equal log-softmax over full logits; TRL's metrics averaged over pairs."""

from __future__ import annotations

import math

import pytest
import torch

from portachat.data.batch import Batch
from portachat.model import GPT, GPTConfig
from portachat.train.preference_loss import PreferenceMetrics, preference_loss, sequence_logps

# Two pairs: summed log-probs of chosen/rejected replies under the policy and the reference, reply lengths.
C, R = [-12.0, -30.5], [-15.0, -20.0]
C0, R0 = [-13.0, -29.0], [-14.0, -22.5]
LC, LR = [4, 10], [5, 8]


def logsig(x: float) -> float:
    return -math.log1p(math.exp(-x))


def published(kind: str, i: int, beta: float, gamma: float = 0.5) -> float:
    c, r, c0, r0, lc, lr = C[i], R[i], C0[i], R0[i], LC[i], LR[i]
    if kind == "dpo":  # Rafailov et al. 2023, eq. 7
        return -logsig(beta * ((c - c0) - (r - r0)))
    if kind == "ipo":  # Azar et al. 2023, eq. 17 (per-token log-ratios, as TRL)
        return ((c - c0) / lc - (r - r0) / lr - 1 / (2 * beta)) ** 2
    if kind == "simpo":  # Meng et al. 2024, eq. 6
        return -logsig(beta / lc * c - beta / lr * r - gamma)
    # ORPO, Hong et al. 2024: L_SFT + lambda * L_OR, odds(y) = P(y) / (1 - P(y)), P(y) = exp(mean log-prob)
    pc, pr = math.exp(c / lc), math.exp(r / lr)
    return -c / lc - beta * logsig(math.log((pc / (1 - pc)) / (pr / (1 - pr))))


@pytest.mark.parametrize("kind,beta", [("dpo", 0.1), ("dpo", 0.5), ("ipo", 0.1), ("simpo", 2.0), ("orpo", 0.1)])
def test_losses_follow_the_published_formulas(kind, beta):
    t = lambda xs: torch.tensor(xs, dtype=torch.float64)  # noqa: E731
    scores = preference_loss(kind, beta, t(C), t(R), t(LC), t(LR), t(C0), t(R0), gamma=0.5)
    for i in range(2):
        assert scores.losses[i].item() == pytest.approx(published(kind, i, beta), rel=1e-9)
    if kind in ("dpo", "ipo"):
        assert scores.chosen_rewards.tolist() == pytest.approx([beta * (c - c0) for c, c0 in zip(C, C0, strict=True)])
        assert scores.rejected_rewards.tolist() == pytest.approx([beta * (r - r0) for r, r0 in zip(R, R0, strict=True)])
    else:  # no reference: beta times the mean log-prob per token, as TRL's CPO/ORPO trainers log
        assert scores.chosen_rewards.tolist() == pytest.approx([beta * c / n for c, n in zip(C, LC, strict=True)])


def test_dpo_and_ipo_need_the_reference():
    with pytest.raises(ValueError, match="reference"):
        preference_loss("dpo", 0.1, torch.zeros(1), torch.zeros(1), torch.ones(1), torch.ones(1))
    with pytest.raises(ValueError, match="unknown"):
        preference_loss("kto", 0.1, torch.zeros(1), torch.zeros(1), torch.ones(1), torch.ones(1))


def test_sequence_logps_equal_log_softmax_of_the_full_logits():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=96, n_layer=1, n_embd=32, n_head=2, n_kv_head=2, head_dim=16,
                          intermediate_size=64, max_seq_len=16))
    model.init_weights(seed=1)
    inputs = torch.randint(0, 96, (3, 12))
    targets = torch.randint(0, 96, (3, 12))
    targets[:, :4] = -1  # the prompt
    targets[2, 9:] = -1  # a shorter reply, then padding
    logps, counts = sequence_logps(model, Batch(inputs, targets))
    full = torch.log_softmax(model(inputs).double(), dim=-1)
    want = torch.stack([sum(full[b, t, targets[b, t]] for t in range(12) if targets[b, t] >= 0) for b in range(3)])
    torch.testing.assert_close(logps.double(), want, atol=1e-4, rtol=0)
    assert counts.tolist() == [8, 8, 5]
    logps.sum().backward()  # gradients flow through the chunked path
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0


def test_metrics_average_over_the_pairs_of_every_micro_batch():
    metrics = PreferenceMetrics(torch.device("cpu"))
    t = lambda xs: torch.tensor(xs)  # noqa: E731
    for sl in (slice(0, 1), slice(1, 2)):  # two micro-batches of one pair each
        scores = preference_loss("dpo", 0.1, t(C)[sl], t(R)[sl], t(LC)[sl], t(LR)[sl], t(C0)[sl], t(R0)[sl])
        metrics.add(scores, t(C)[sl], t(R)[sl])
    got = metrics.read()
    rc = [0.1 * (c - c0) for c, c0 in zip(C, C0, strict=True)]
    rr = [0.1 * (r - r0) for r, r0 in zip(R, R0, strict=True)]
    assert got["rewards/chosen"] == pytest.approx(sum(rc) / 2)
    assert got["rewards/rejected"] == pytest.approx(sum(rr) / 2)
    assert got["rewards/accuracies"] == pytest.approx(sum(a > b for a, b in zip(rc, rr, strict=True)) / 2)
    assert got["rewards/margins"] == pytest.approx((sum(rc) - sum(rr)) / 2)
    assert got["logps/chosen"] == pytest.approx(sum(C) / 2) and got["logps/rejected"] == pytest.approx(sum(R) / 2)
    assert metrics.read()["rewards/chosen"] == 0.0  # read() starts the next step afresh
