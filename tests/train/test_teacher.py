"""The in-process teacher: a whole-vocabulary teacher gives its hidden states, the distillation loss runs its
head a chunk at a time, and the result equals the loss from both models' whole logits; no teacher tensor of
[supervised positions x vocabulary] is alive for the student's backward."""

from __future__ import annotations

import pytest
import torch

from portachat.data.batch import Batch
from portachat.device.memtrack import LiveTensorBytes
from portachat.model import GPT
from portachat.train.distill import DistillHook
from portachat.train.distill_loss import DistillLoss, distill_loss_sum, teacher_targets, token_loss
from portachat.train.teacher import InProcessTeacher, supervised_indices
from tests.model.gpt_testing import randomized, tiny_config


def batch_of(rows: int, T: int, vocab: int, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, vocab, (rows, T), generator=g)
    targets = idx.roll(-1, dims=1)
    targets[:, : T // 3] = -1  # a prompt
    targets[1, -5:] = -1  # a shorter row
    return Batch(idx, targets)


def whole_logits_loss(student: GPT, teacher: GPT, batch: Batch, loss: DistillLoss) -> torch.Tensor:
    """Σ of the per-token loss from both models' logits at every supervised position, all at once."""
    keep = supervised_indices(batch)
    with torch.no_grad():
        t_logits = teacher.lm_head(teacher.hidden_states(batch.inputs)).flatten(0, 1).index_select(0, keep)
    s_logits = student.lm_head(student.hidden_states(batch.inputs)).flatten(0, 1).index_select(0, keep)
    labels = batch.targets.reshape(-1).index_select(0, keep)
    return token_loss(s_logits, teacher_targets(t_logits, loss.temperature, None), labels, None, loss).sum()


@pytest.mark.parametrize("beta,tau", [(0.0, 1.0), (0.0, 2.0), (1.0, 0.7), (0.5, 2.0)])  # forward/reverse KL, JSD
def test_a_whole_vocabulary_teacher_in_chunks_gives_the_whole_logits_loss_and_gradients(beta, tau):
    torch.manual_seed(0)
    teacher = randomized(GPT(tiny_config()), seed=1, std=0.2)
    student = randomized(GPT(tiny_config()), seed=2, std=0.2).train()
    batch = batch_of(rows=3, T=30, vocab=128)
    n = batch.num_supervised()
    loss = DistillLoss(beta=beta, temperature=tau, alpha=0.3)
    hook = DistillHook(student, InProcessTeacher(teacher, "teacher"), loss)
    hook.chunk = 7  # several chunks, the last one short
    assert n > 2 * hook.chunk and n % hook.chunk
    results = []
    for compute in (lambda: hook(student, batch), lambda: whole_logits_loss(student, teacher, batch, loss)):
        value = compute() / n
        grads = torch.autograd.grad(value, list(student.parameters()))
        results.append((value, grads))
    (chunked, g_chunked), (whole, g_whole) = results
    torch.testing.assert_close(chunked, whole, atol=1e-5, rtol=0)
    for (name, _p), a, b in zip(student.named_parameters(), g_chunked, g_whole, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=name)
    assert not any(p.grad is not None for p in teacher.parameters())


def test_no_teacher_tensor_of_vocabulary_size_is_alive_for_the_backward():
    V = 4096
    small = dict(vocab_size=V, n_layer=1, n_embd=32, head_dim=8, intermediate_size=64)
    teacher = randomized(GPT(tiny_config(**small)), seed=1, std=0.1)
    student = randomized(GPT(tiny_config(**small)), seed=2, std=0.1).train()
    batch = batch_of(rows=4, T=128, vocab=V)
    keep = supervised_indices(batch)
    n = keep.numel()
    logits_bytes = n * V * 4  # the teacher's fp32 [supervised positions x vocabulary]
    loss = DistillLoss(beta=0.0, temperature=2.0)
    picked = student.hidden_states(batch.inputs).flatten(0, 1).index_select(0, keep)
    labels = batch.targets.reshape(-1).index_select(0, keep)
    in_process = InProcessTeacher(teacher, "teacher")
    saved_shapes = []

    def record(t: torch.Tensor) -> torch.Tensor:
        saved_shapes.append(tuple(t.shape))
        return t

    with LiveTensorBytes() as live, torch.autograd.graph.saved_tensors_hooks(record, lambda t: t):
        targets = in_process.targets(batch, loss)
        total = distill_loss_sum(picked, student.lm_head, targets, labels, None, loss, chunk=64)
        kept = live.live  # alive between the forward and the student's backward
    total.backward()
    heads_bytes = 2 * V * teacher.config.n_embd * 4  # views of both heads' weights count as storages made here
    assert n > 4 * 64 and 8 * (kept - heads_bytes) < logits_bytes, (kept, logits_bytes)
    assert not any(V in shape for shape in saved_shapes), saved_shapes
    assert targets.logprobs is None and targets.hidden.shape == (n, teacher.config.n_embd)
    assert student.lm_head.weight.grad is not None and torch.isfinite(student.lm_head.weight.grad).all()


def test_a_top_k_teacher_still_gives_k_log_probabilities_and_ids():
    teacher = randomized(GPT(tiny_config()), seed=1, std=0.2)
    batch = batch_of(rows=2, T=20, vocab=128)
    got = InProcessTeacher(teacher, "teacher").targets(batch, DistillLoss(top_k=5, temperature=1.5))
    keep = supervised_indices(batch)
    with torch.no_grad():
        logits = teacher.lm_head(teacher.hidden_states(batch.inputs)).flatten(0, 1).index_select(0, keep)
    want = teacher_targets(logits, 1.5, 5)
    assert got.hidden is None and got.ids.shape == (keep.numel(), 5)
    assert torch.equal(got.ids, want.ids)
    torch.testing.assert_close(got.logprobs, want.logprobs)
