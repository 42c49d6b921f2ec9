"""The distillation losses on fixed logits: the textbook formula, TRL's GKD loss, the top-k tail, chunking."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from portachat.train.distill_loss import (
    DistillLoss,
    distill_loss_sum,
    generalized_jsd,
    teacher_targets,
    token_loss,
)

N, V = 12, 50


def fixed_logits(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    student = torch.randn(N, V, generator=g, dtype=torch.float64).float() * 2
    teacher = torch.randn(N, V, generator=g, dtype=torch.float64).float() * 3
    labels = torch.randint(0, V, (N,), generator=g)
    return student, teacher, labels


@pytest.mark.parametrize("tau,alpha", [(1.0, 0.0), (2.0, 0.5), (0.7, 1.0)])
def test_forward_kl_is_the_textbook_distillation_loss(tau, alpha):
    student, teacher, labels = fixed_logits()
    ours = token_loss(student, teacher_targets(teacher, tau, None), labels, None,
                      DistillLoss(beta=0.0, temperature=tau, alpha=alpha)).mean()
    # Hinton et al.: KL(softmax(t/τ) ‖ softmax(s/τ)) · τ² + α · CE(s, y), averaged over tokens
    kl = F.kl_div(F.log_softmax(student / tau, -1), F.softmax(teacher / tau, -1), reduction="batchmean")
    guide = kl * tau**2 + alpha * F.cross_entropy(student, labels)
    assert abs(ours.item() - guide.item()) < 1e-6


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("tau", [1.0, 2.0])
def test_divergence_matches_trl_gkd(beta, tau):
    gkd = pytest.importorskip("trl.experimental.gkd.gkd_trainer")
    student, teacher, _labels = fixed_logits(seed=1)
    ours = token_loss(student, teacher_targets(teacher, tau, None), _labels, None,
                      DistillLoss(beta=beta, temperature=tau)).mean() / tau**2
    theirs = gkd.GKDTrainer.generalized_jsd_loss(student[None], teacher[None], labels=_labels[None], beta=beta,
                                                 temperature=tau)  # per supervised token, as ours
    assert abs(ours.item() - theirs.item()) < 1e-6


def test_divergences_are_zero_for_equal_distributions_and_reverse_kl_swaps_sides():
    student, teacher, _ = fixed_logits(seed=2)
    s, t = F.log_softmax(student, -1), F.log_softmax(teacher, -1)
    for beta in (0.0, 0.5, 1.0):
        assert generalized_jsd(s, s, beta).abs().max() < 1e-6
    torch.testing.assert_close(generalized_jsd(s, t, 1.0), generalized_jsd(t, s, 0.0))
    assert (generalized_jsd(s, t, 0.0) - generalized_jsd(s, t, 1.0)).abs().max() > 1e-3


def test_top_k_compares_k_ids_and_the_tail():
    student, teacher, labels = fixed_logits(seed=3)
    loss = DistillLoss(beta=0.0, temperature=1.5, top_k=5)
    targets = teacher_targets(teacher, loss.temperature, loss.top_k)
    assert targets.ids.shape == (N, 5) and targets.logprobs.shape == (N, 5)
    ours = token_loss(student, targets, labels, None, loss)
    # by hand: p and q on the 5 teacher ids plus one "any other token" outcome
    p_all = F.softmax(teacher.double() / 1.5, -1)
    q_all = F.softmax(student.double() / 1.5, -1)
    p = p_all.gather(1, targets.ids)
    q = q_all.gather(1, targets.ids)
    p = torch.cat([p, 1 - p.sum(1, keepdim=True)], 1)
    q = torch.cat([q, 1 - q.sum(1, keepdim=True)], 1)
    by_hand = (torch.special.xlogy(p, p) - p * q.log()).sum(1) * 1.5**2
    torch.testing.assert_close(ours.double(), by_hand, atol=1e-5, rtol=1e-5)
    full = token_loss(student, teacher_targets(teacher, 1.5, None), labels, None, DistillLoss(beta=0.0, temperature=1.5))
    assert (ours <= full + 1e-6).all()  # coarse-graining never raises a divergence
    # k = V: the tail is empty and the top-k loss is the full one
    every = token_loss(student, teacher_targets(teacher, 1.5, V - 1), labels, None, DistillLoss(temperature=1.5))
    whole = token_loss(student, teacher_targets(teacher, 1.5, None), labels, None, DistillLoss(temperature=1.5))
    assert (every - whole).abs().max() < 1e-3  # only the least likely id is in the tail


def test_top_k_gradients_stay_finite_when_the_student_puts_all_mass_on_the_k_ids():
    teacher = torch.full((2, V), -30.0)
    teacher[:, :3] = 5.0
    student = teacher.clone().mul(10).requires_grad_(True)  # the student's tail rounds to exactly 0
    for beta in (0.0, 0.5, 1.0):
        loss = token_loss(student, teacher_targets(teacher, 1.0, 3), torch.zeros(2, dtype=torch.long), None,
                          DistillLoss(beta=beta, top_k=3)).sum()
        (grad,) = torch.autograd.grad(loss, student)
        assert torch.isfinite(loss) and torch.isfinite(grad).all()


def test_chunked_sum_matches_one_chunk_values_and_gradients():
    torch.manual_seed(0)
    hidden = torch.randn(N, 16, requires_grad=True)
    head = torch.nn.Linear(16, V, bias=False)
    _, teacher, labels = fixed_logits(seed=4)
    weights = torch.tensor([1.0, 0.0] * (N // 2))
    loss = DistillLoss(beta=0.5, temperature=2.0, alpha=0.3, top_k=7)
    targets = teacher_targets(teacher, 2.0, 7)
    one = distill_loss_sum(hidden, head, targets, labels, weights, loss, chunk=N)
    g_one = torch.autograd.grad(one, [hidden, head.weight])
    many = distill_loss_sum(hidden, head, targets, labels, weights, loss, chunk=5)
    g_many = torch.autograd.grad(many, [hidden, head.weight])
    torch.testing.assert_close(one, many)
    for a, b in zip(g_one, g_many, strict=True):
        torch.testing.assert_close(a, b)
    # w = 0 rows carry no cross-entropy: their loss is the divergence alone
    div_only = token_loss(head(hidden), targets, labels, torch.zeros(N), loss)
    both = token_loss(head(hidden), targets, labels, weights, loss)
    assert torch.equal(div_only[1::2], both[1::2]) and (both[0::2] > div_only[0::2]).all()


@pytest.mark.parametrize("kwargs,flag", [(dict(beta=1.5), "--beta"), (dict(temperature=0.0), "--temperature"),
                                         (dict(alpha=-1.0), "--alpha"), (dict(top_k=0), "--top-k")])
def test_bad_settings_are_refused_naming_the_flag(kwargs, flag):
    with pytest.raises(ValueError, match=flag):
        DistillLoss(**kwargs).check()
