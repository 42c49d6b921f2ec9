"""Ascend's fast paths through stand-in torch_npu modules (tests/fakes/torch_npu_standin.py): the documented
kernels pass their self-tests and our call sites give the portable path's outputs through them; a wrong
kernel (layout, convention) or a crashing one fails its self-test and the portable path runs instead."""

from __future__ import annotations

import pytest
import torch

from portachat.device import fast_paths
from portachat.device.fast_path_choice import candidates
from portachat.device.npu_kernels import has_op
from portachat.engine.sampler import filter_top_k_top_p
from portachat.model import GPT, GPTConfig
from portachat.ops import fast_ops, fast_path
from portachat.ops.selftest import CHECKS, run_selftest
from tests.device.device_sim import ascend
from tests.fakes import forget_fast_path_answers
from tests.fakes import torch_npu_standin as standin
from tests.fakes.ascend_device import ascend_a2, on_ascend

NPU_CHECKS = [n for n in CHECKS if n.startswith("npu_")]
KERNEL_OF = {"npu_paged_attention": "_npu_paged_attention", "npu_reshape_and_cache": "_npu_reshape_and_cache"}


@pytest.fixture(autouse=True)
def _fresh():
    forget_fast_path_answers()
    yield
    forget_fast_path_answers()


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("name", NPU_CHECKS)
def test_documented_kernels_pass_their_self_test(monkeypatch, name, dtype):
    standin.install(monkeypatch, standin.module())
    v = CHECKS[name](ascend_a2(dtype))
    assert v.ok, v.reason


@pytest.mark.parametrize("name", NPU_CHECKS)
def test_a_wrong_kernel_fails_its_self_test(monkeypatch, name):
    standin.install(monkeypatch, standin.wrong(KERNEL_OF.get(name, name)))
    v = CHECKS[name](ascend_a2())
    assert not v.ok and "disagrees" in v.reason


@pytest.mark.parametrize("name", NPU_CHECKS)
def test_a_crashing_kernel_fails_its_self_test_with_its_error(monkeypatch, name):
    standin.install(monkeypatch, standin.crashing(KERNEL_OF.get(name, name)))
    v = CHECKS[name](ascend_a2())
    assert not v.ok and "RuntimeError" in v.reason and "EZ9999" in v.reason


def test_candidates_follow_the_soc_and_what_torch_npu_exposes(monkeypatch):
    standin.install(monkeypatch, standin.module())
    a2 = candidates(ascend("Ascend910B3", bf16=True), has_op, attention="npu_fusion_attention")
    assert set(NPU_CHECKS) <= set(a2) and "decode_graphs" in a2
    assert "npu_fusion_attention" not in candidates(ascend("Ascend910B3", bf16=True), has_op)  # SDPA chosen
    a1 = candidates(ascend("Ascend910A", bf16=False), has_op)
    assert {"npu_rms_norm", "npu_rotary_mul"} <= set(a1) and "npu_swiglu" not in a1 and "npu_top_k_top_p" not in a1
    older = standin.module()
    del older.npu_top_k_top_p  # an older torch_npu without the kernel: not a candidate at all
    standin.install(monkeypatch, older)
    assert "npu_top_k_top_p" not in candidates(ascend("Ascend910B3", bf16=True), has_op)


def _config(**kw) -> GPTConfig:
    """head_dim 64 (the rotary kernel takes multiples of 64), grouped-query heads, QK-norm."""
    return GPTConfig(n_embd=128, n_head=2, n_kv_head=1, head_dim=64, intermediate_size=256, max_seq_len=64, **kw)


def test_doctor_selftest_on_ascend_checks_each_candidate_and_keeps_only_the_good_ones(monkeypatch, capsys):
    standin.install(monkeypatch, standin.wrong("npu_swiglu"))
    dev = ascend_a2()
    on_ascend(monkeypatch, dev)
    verdicts = {v.name: v for v in run_selftest(dev)}
    assert not verdicts["npu_swiglu"].ok
    assert all(verdicts[n].ok for n in NPU_CHECKS if n != "npu_swiglu")
    assert not verdicts["decode_graphs"].ok  # no graph check given to the ops floor: said, and off
    assert fast_path.enabled("npu_swiglu", "cpu", fast_ops.check_swiglu) is False
    assert fast_path.enabled("npu_rms_norm", "cpu", fast_ops.check_rms_norm) is True


def test_model_forward_and_backward_match_the_portable_path_through_the_stand_in(monkeypatch):
    """GPT's RMSNorm, rotary and SwiGLU call sites through the documented kernels: the same loss and
    gradients as the portable path (fp32), and the kernels were actually called."""
    torch.manual_seed(0)
    model = GPT(_config(n_layer=2, vocab_size=128))
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.1)
    ids = torch.randint(0, 128, (2, 16))

    def loss_and_grads():
        model.zero_grad()
        loss = model(ids, ids)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    ref_loss, ref_grads = loss_and_grads()
    calls = []
    mod = standin.module()
    for name in ("npu_rms_norm", "npu_rotary_mul", "npu_swiglu"):
        real = getattr(mod, name)
        setattr(mod, name, lambda *a, _real=real, _n=name, **k: calls.append(_n) or _real(*a, **k))
    standin.install(monkeypatch, mod)
    on_ascend(monkeypatch, ascend_a2())
    loss, grads = loss_and_grads()
    assert {"npu_rms_norm", "npu_rotary_mul", "npu_swiglu"} <= set(calls)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    for g, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, want, rtol=1e-4, atol=1e-6)


def test_a_wrong_kernel_is_never_used_by_the_model(monkeypatch, capsys):
    torch.manual_seed(0)
    model = GPT(_config(n_layer=1, vocab_size=64))
    ids = torch.randint(0, 64, (1, 8))
    with torch.no_grad():
        want = model(ids)
    standin.install(monkeypatch, standin.wrong("npu_rms_norm"))
    on_ascend(monkeypatch, ascend_a2())
    with torch.no_grad():
        got = model(ids)
        model(ids)
    torch.testing.assert_close(got, want)
    assert capsys.readouterr().err.count("fast path npu_rms_norm is off") == 1


def test_the_batched_top_k_top_p_keeps_what_the_per_row_filter_keeps(monkeypatch):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 500, generator=g) * 2
    logits[1, :10] = 5.0  # ties at the k-th value stay, as in the per-row filter
    ks, ps = [0, 7, 50, 0, 500, 3], [1.0, 1.0, 0.9, 0.3, 0.75, 0.5]
    want = torch.stack([filter_top_k_top_p(logits[i], ks[i], ps[i]) for i in range(6)])
    top_k, top_p = torch.tensor(ks), torch.tensor(ps)
    assert torch.equal(torch.isfinite(fast_ops.top_k_top_p_reference(logits, top_k, top_p)), torch.isfinite(want))
    standin.install(monkeypatch, standin.module())
    on_ascend(monkeypatch, ascend_a2())
    calls = []
    real = standin.npu_top_k_top_p
    monkeypatch.setattr(standin, "npu_top_k_top_p", lambda *a: calls.append(1) or real(*a))
    fast = fast_ops.top_k_top_p(logits, top_k, top_p)
    assert torch.equal(torch.isfinite(fast), torch.isfinite(want))
    kept = torch.isfinite(want)
    assert torch.equal(fast[kept], logits[kept])


def test_fused_adamw_is_kept_where_it_matches_foreach_and_dropped_where_it_raises(monkeypatch):
    """The real fused AdamW kernel (on the CPU here) agrees with foreach AdamW; one that raises, as a
    torch_npu without the kernel does, is dropped and the Ascend device builds foreach AdamW."""
    from portachat.device.fused_adamw import check_fused_adamw

    dev = ascend_a2()
    assert check_fused_adamw(dev).ok
    assert dev.decisions["fused_optimizer"].value is True and dev.fused_optimizer is True

    def not_implemented(*a, **k):
        raise NotImplementedError("_fused_adamw_ is not implemented for PrivateUse1")

    monkeypatch.setattr(torch, "_fused_adamw_", not_implemented)
    fast_paths.forget()
    (fast_paths.verdicts_path()).unlink()
    v = check_fused_adamw(dev)
    assert not v.ok and "NotImplementedError" in v.reason
    assert ascend_a2().fused_optimizer is False


@pytest.mark.parametrize("wrong", [False, True])
def test_the_engines_prefill_runs_the_fused_kernel_only_where_it_passed(monkeypatch, wrong):
    """ops/paged_attention.prefill_attention (the engine's prefill chunks): through the documented kernel the
    SDPA path's output (bf16), the kernel called; a kernel reading the causal mode wrong is never called."""
    from portachat.ops import paged_attention as pa

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(6, h, 64, generator=g).bfloat16() for h in (4, 2, 2))
    kc, vc = (torch.randn(2, 32, 64, generator=g).bfloat16() for _ in range(2))
    index = torch.arange(20)
    mask = torch.arange(20)[None] <= torch.arange(14, 20)[:, None]  # the runner's mask for a continued chunk
    want = [pa._sdpa_prefill(q, k, v, None, None, None, None), pa._sdpa_prefill(q, k, v, kc, vc, index, mask)]
    mod = standin.wrong("npu_fused_infer_attention_score") if wrong else standin.module()
    calls = []
    real = mod.npu_fused_infer_attention_score
    mod.npu_fused_infer_attention_score = lambda *a, **kw: calls.append(1) or real(*a, **kw)
    standin.install(monkeypatch, mod)
    on_ascend(monkeypatch, ascend_a2("bf16"))
    got = [pa.prefill_attention(q, k, v, None, None, None, None), pa.prefill_attention(q, k, v, kc, vc, index, mask)]
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=4e-2, atol=2e-2)
    checked = 2  # the self-test's own calls (two chunks, kernel side), then the two real ones or none
    assert len(calls) == (checked if wrong else checked + 2)
