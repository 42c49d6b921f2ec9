"""GRPO's loss: the clipped ratio and the k3 KL against their formulas and TRL's GRPOTrainer on fixed
log-probabilities, and the hook's gradient against the plain policy gradient (one step per batch)."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import portachat.model.gpt as gpt_module
from portachat.data.batch import Batch
from portachat.model import GPT, GPTConfig
from portachat.train.grpo_loss import GRPOLoss, clipped_token_loss, k3_kl, token_logprobs
from portachat.train.trainer import token_loss
from tests.model.gpt_testing import randomized, tiny_config

torch.manual_seed(0)
LOGP = torch.randn(3, 5) * 0.5 - 1.0
OLD = LOGP + torch.randn(3, 5) * 0.3  # ratios well outside [0.8, 1.2] for some tokens
REF = LOGP + torch.randn(3, 5) * 0.2
ADV = torch.tensor([[1.0], [-0.5], [0.25]])
MASK = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.float32)


def test_clipped_ratio_and_k3_follow_their_formulas():
    loss = clipped_token_loss(LOGP, OLD, ADV, eps_low=0.2, eps_high=0.28, beta=0.04, ref_logp=REF)
    for i in range(3):
        for t in range(5):
            r = float(torch.exp(LOGP[i, t] - OLD[i, t]))
            a = float(ADV[i, 0])
            clipped = min(max(r, 0.8), 1.28)
            d = float(REF[i, t] - LOGP[i, t])
            want = -min(r * a, clipped * a) + 0.04 * (torch.exp(torch.tensor(d)).item() - d - 1)
            assert abs(float(loss[i, t]) - want) < 1e-5
    assert (k3_kl(LOGP, REF) >= 0).all() and k3_kl(LOGP, LOGP).abs().max() == 0


def trl_loss(beta: float, eps_low: float, eps_high: float) -> torch.Tensor:
    """TRL's GRPOTrainer._compute_loss (loss_type "dapo": token-level) on the fixed tensors above."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    identity = SimpleNamespace(reduce=lambda x, reduction="sum": x, gather=lambda x: x,
                               gather_for_metrics=lambda x: x, num_processes=1, sync_gradients=True)
    fake = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (LOGP, torch.zeros_like(LOGP), None),
        aux_loss_enabled=False, top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        importance_sampling_level="token", beta=beta, loss_type="dapo", epsilon_low=eps_low, epsilon_high=eps_high,
        use_vllm=False, model=SimpleNamespace(training=True), accelerator=identity,
        current_gradient_accumulation_steps=1, _entropy_bonus_enabled=False, _metrics=defaultdict(lambda: defaultdict(list)),
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1),
    )
    inputs = {"prompt_ids": torch.zeros(3, 2, dtype=torch.long), "prompt_mask": torch.ones(3, 2),
              "completion_ids": torch.zeros(3, 5, dtype=torch.long), "completion_mask": MASK,
              "advantages": ADV[:, 0], "old_per_token_logps": OLD, "ref_per_token_logps": REF,
              "num_items_in_batch": MASK.sum()}
    return GRPOTrainer._compute_loss(fake, None, inputs)


def test_token_level_loss_equals_trls_dapo_loss():
    for beta, eps_low, eps_high in ((0.0, 0.2, 0.2), (0.04, 0.2, 0.28)):
        ours = (clipped_token_loss(LOGP, OLD, ADV, eps_low, eps_high, beta, REF) * MASK).sum() / MASK.sum()
        torch.testing.assert_close(ours, trl_loss(beta, eps_low, eps_high), atol=1e-6, rtol=0)


def tiny_gpt() -> GPT:
    model = GPT(GPTConfig(vocab_size=64, n_layer=1, n_embd=32, n_head=2, n_kv_head=2, head_dim=16,
                          intermediate_size=64, max_seq_len=32))
    model.init_weights(seed=3)
    return model


def rollout_like_batch() -> Batch:
    g = torch.Generator().manual_seed(1)
    inputs = torch.randint(0, 64, (4, 12), generator=g)
    targets = torch.roll(inputs, -1, dims=1)
    targets[:, :5] = -1  # the prompt
    targets[1, 9:] = -1  # a shorter reply
    weights = torch.tensor([0.5, -0.5, 1.0, -1.0])[:, None].expand(4, 12).contiguous()
    return Batch(inputs, targets, weights)


def test_hook_is_the_policy_gradient_on_fresh_rollouts():
    """One optimizer step per batch: logp_old = logp, ratio 1, so the gradient is -A grad logp: exactly
    the REINFORCE loss the synthetic-task RL uses (token_loss with the advantages as weights)."""
    batch = rollout_like_batch()
    a, b = tiny_gpt(), tiny_gpt()
    grpo = GRPOLoss(eps_low=0.2)(a, batch)
    reinforce = token_loss(b, batch)
    mask = batch.targets >= 0
    torch.testing.assert_close(grpo, -(batch.weights * mask).sum(), atol=1e-5, rtol=0)  # ratio 1 in value
    grpo.backward()
    reinforce.backward()
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa.grad, pb.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_kl_term_pulls_toward_the_reference():
    batch = rollout_like_batch()
    batch.weights.zero_()  # no advantage: only the KL acts
    model, reference = tiny_gpt(), tiny_gpt()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    hook = GRPOLoss(beta=1.0, reference=reference.requires_grad_(False))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for _ in range(4):
        opt.zero_grad()
        loss = hook(model, batch) / (batch.targets >= 0).sum()
        losses.append(float(loss.detach()))
        loss.backward()
        opt.step()
    assert losses[0] > 0 and losses[-1] < losses[0] * 0.8, losses


@pytest.mark.parametrize("chunk", [None, 5])  # the model's own chunk size (one chunk here), or several
@pytest.mark.parametrize("host_indices", [False, True])  # supervised positions found by the loss, or given
def test_token_logprobs_equal_a_full_log_softmax_values_and_gradients(monkeypatch, chunk, host_indices):
    if chunk is not None:
        monkeypatch.setattr(gpt_module, "loss_chunk_size", lambda _vocab: chunk)
    batch = rollout_like_batch()
    if host_indices:
        batch.supervised = (batch.targets.reshape(-1) >= 0).nonzero().squeeze(1)
    chunked, whole = (randomized(GPT(tiny_config(vocab_size=64)), seed=4, std=0.2).train() for _ in range(2))
    ours = token_logprobs(chunked, batch)
    mask = batch.targets >= 0
    full = F.log_softmax(whole.lm_head(whole.hidden_states(batch.inputs)).float(), dim=-1)
    theirs = full.gather(-1, batch.targets.clamp(min=0)[..., None]).squeeze(-1) * mask
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    assert (ours[~mask] == 0).all()
    (ours * batch.weights).sum().backward()  # the policy gradient's shape: advantage-weighted log-probs
    (theirs * batch.weights).sum().backward()
    for (name, a), b in zip(chunked.named_parameters(), whole.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=0, msg=name)
