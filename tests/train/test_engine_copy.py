"""Engine work inside training runs on a copy of the weights in the device's inference dtype (bf16 on
accelerators), never on the fp32 master weights; the CPU keeps the model itself. The copy's dtype is a
device decision (simulated probes); the copies themselves are made and checked on the CPU."""

from __future__ import annotations

import pytest
import torch
from test_samples import small_gpt

from portachat.device import Device, get_device
from portachat.device.inference import rollout_engine_dtype, training_engine_dtype
from portachat.train import engine_copy, rollout, samples
from portachat.train.engine_copy import engine_weights, inference_copy, refresh_copy
from portachat.train.rollout import Rollout
from tests.device.device_sim import ascend, cpu, h100


def test_the_copy_dtype_is_the_devices_compute_dtype_and_none_on_a_cpu():
    assert training_engine_dtype(Device(h100())) == torch.bfloat16
    assert training_engine_dtype(Device(ascend("Ascend910A", bf16=False))) == torch.float16
    assert training_engine_dtype(Device(h100(), dtype="fp32")) is None  # training in fp32: nothing to halve
    assert training_engine_dtype(Device(cpu())) is None


def test_rl_rollouts_copy_on_a_cpu_too_where_a_frozen_copy_runs_the_fused_forward():
    assert rollout_engine_dtype(Device(cpu())) == torch.float32
    assert rollout_engine_dtype(Device(h100())) == torch.bfloat16
    assert rollout_engine_dtype(Device(h100(), dtype="fp32")) is None  # no fused forward off the CPU: no copy


def test_a_copy_is_frozen_in_the_dtype_and_leaves_the_master_weights_alone(small_tokenizer):
    model = small_gpt(small_tokenizer.vocab_size)
    model(torch.tensor([[1, 2, 3]]), torch.tensor([[2, 3, 4]])).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    twin = inference_copy(model, torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad and p.grad is None for p in twin.parameters())
    assert all(p.dtype == torch.float32 and p.requires_grad for p in model.parameters())
    assert all(torch.equal(p.grad, grads[n]) for n, p in model.named_parameters())
    for t, m in zip(twin.parameters(), model.parameters(), strict=True):
        assert t.data_ptr() != m.data_ptr() and torch.equal(t, m.detach().to(torch.bfloat16))
    assert not twin.training and model.training
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    refresh_copy(twin, model)
    first = next(model.parameters())
    assert torch.equal(next(twin.parameters()), first.detach().to(torch.bfloat16))


def test_tied_weights_stay_tied_in_the_copy(small_tokenizer):
    model = small_gpt(small_tokenizer.vocab_size)
    model.lm_head.weight = model.model.embed_tokens.weight
    twin = inference_copy(model, torch.bfloat16)
    assert twin.lm_head.weight is twin.model.embed_tokens.weight


@pytest.fixture
def accelerator_like(monkeypatch):
    """The CPU device, with the copy decision an accelerator makes (bf16)."""
    monkeypatch.setattr(engine_copy, "training_engine_dtype", lambda dev: torch.bfloat16)
    monkeypatch.setattr(rollout, "rollout_engine_dtype", lambda dev: torch.bfloat16)
    return get_device("cpu")


def test_samples_run_on_a_copy_made_for_the_call(small_tokenizer, monkeypatch, accelerator_like):
    model = small_gpt(small_tokenizer.vocab_size)
    seen = []
    real = samples.generate_once
    monkeypatch.setattr(samples, "generate_once", lambda m, *a: seen.append(m) or real(m, *a))
    out = samples.greedy_samples(model, small_tokenizer, ["the"], 4, accelerator_like)
    assert out[0].startswith("the") and len(seen) == 1 and seen[0] is not model
    assert {p.dtype for p in seen[0].parameters()} == {torch.bfloat16}
    assert all(p.dtype == torch.float32 and p.requires_grad for p in model.parameters()) and model.training


def test_the_cpu_runs_the_model_itself(small_tokenizer):
    model = small_gpt(small_tokenizer.vocab_size)
    with engine_weights(model, get_device("cpu")) as weights:
        assert weights is model


def test_rollouts_sample_from_a_copy_refreshed_from_this_steps_weights(small_tokenizer, accelerator_like):
    model = small_gpt(small_tokenizer.vocab_size)
    sampler = Rollout(model, small_tokenizer, accelerator_like, max_num_seqs=2)
    ids = small_tokenizer.encode("the", prepend_bos=True)
    sampler.sample([ids], 3, temperature=0.0, seeds=[0])
    copy = sampler.weights
    assert copy is not model and sampler.engine().model is copy
    assert {p.dtype for p in copy.parameters()} == {torch.bfloat16}
    assert all(p.dtype == torch.float32 and p.requires_grad for p in model.parameters()) and model.training
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)
    sampler.sample([ids], 3, temperature=0.0, seeds=[0])
    assert sampler.weights is copy  # refreshed in place, not made again
    for t, m in zip(copy.parameters(), model.parameters(), strict=True):
        assert torch.equal(t, m.detach().to(torch.bfloat16))
