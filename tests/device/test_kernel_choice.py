"""Kernel choices are per device type and made when a Device is built: asking for another device (the CPU
for host-side work) never switches what the accelerator's tensors run. GQA on an NPU goes without SDPA's
enable_gqa (torch_npu lacks it), through a device-layer decision the ops follow."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from device_sim import ascend, h100, hip

from portachat.device import Device, get_device
from portachat.device.fused_attention import KernelChoice, kernels_for, use_kernels
from portachat.device.policy import decide_gqa
from portachat.ops import attention as attention_ops
from portachat.ops.paged_attention import prefill_attention

FUSED_NPU = KernelChoice(attention="npu_fusion_attention", packed="dense_mask", gqa="repeat_kv")


@pytest.fixture
def restore_kernels():
    saved = {t: kernels_for(t) for t in ("cpu", "npu", "cuda")}
    yield
    for device_type, choice in saved.items():
        use_kernels(device_type, choice)


def test_choosing_the_cpu_leaves_the_accelerators_backend_as_it_was(restore_kernels):
    use_kernels("npu", FUSED_NPU)  # what get_device() hands over when it builds an Ascend 910B device
    cpu = get_device("cpu")
    assert kernels_for("npu") == FUSED_NPU
    assert kernels_for("cpu") == cpu.kernel_choice and cpu.kernel_choice.attention == "sdpa"


def test_a_cached_device_does_not_reassert_its_choice(restore_kernels):
    get_device("cpu")
    use_kernels("cpu", KernelChoice(packed="flex"))  # set explicitly by its owner, e.g. a test or a tool
    get_device("cpu")  # the same cached device, asked for again
    assert kernels_for("cpu").packed == "flex"


def test_npu_tensors_default_to_repeated_kv_heads_before_any_device_is_built():
    assert kernels_for("npu").gqa == "repeat_kv" and kernels_for("xpu").gqa == "native"


@pytest.mark.parametrize(("facts", "expected", "why"), [
    (ascend("Ascend910B3", True), "repeat_kv", "enable_gqa"),
    (ascend("Ascend910A", False), "repeat_kv", "enable_gqa"),
    (ascend("Ascend310P3", False), "repeat_kv", "enable_gqa"),
    (h100(), "native", "enable_gqa"),
    (h100(torch_version="2.4.1+cu121"), "repeat_kv", "torch >= 2.5"),
    (hip("dcu", "gfx928", "K100_AI"), "native", "enable_gqa"),
])
def test_gqa_decision(facts, expected, why):
    decision = decide_gqa(facts)
    assert decision.value == expected and why in decision.reason
    assert Device(facts).kernel_choice.gqa == expected


def _no_enable_gqa_sdpa(monkeypatch):
    """A stand-in for torch_npu's SDPA: the documented semantics, and no enable_gqa."""
    real = F.scaled_dot_product_attention
    calls = []

    def npu_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kwargs):
        if "enable_gqa" in kwargs:
            raise RuntimeError("npu_sdpa: unexpected keyword argument 'enable_gqa'")
        assert k.size(1) == q.size(1), "torch_npu needs as many kv heads as query heads"
        calls.append(q.size(1))
        return real(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale)

    monkeypatch.setattr(attention_ops.F, "scaled_dot_product_attention", npu_sdpa)
    return calls


def test_grouped_attention_through_a_backend_without_enable_gqa(monkeypatch, restore_kernels):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 6, 9, 16, generator=g)
    k, v = torch.randn(2, 2, 9, 16, generator=g), torch.randn(2, 2, 9, 16, generator=g)
    mask = torch.ones(9, 9, dtype=torch.bool).tril()
    want_causal = attention_ops.attention(q, k, v, is_causal=True)  # SDPA's own enable_gqa on the CPU
    want_masked = attention_ops.attention(q, k, v, is_causal=False, attn_mask=mask)
    # the chunk's own keys, then keys gathered from a [H_kv, slots, D] cache: the engine's prefill paths
    cache_k, cache_v = k[0].clone(), v[0].clone()
    want_prefill = prefill_attention(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1),
                                     cache_k, cache_v, None, None)
    want_cached = prefill_attention(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1),
                                    cache_k, cache_v, torch.arange(9), mask)
    calls = _no_enable_gqa_sdpa(monkeypatch)
    use_kernels("cpu", KernelChoice(gqa="repeat_kv"))  # what an NPU device hands over
    torch.testing.assert_close(attention_ops.attention(q, k, v, is_causal=True), want_causal)
    torch.testing.assert_close(attention_ops.attention(q, k, v, is_causal=False, attn_mask=mask), want_masked)
    torch.testing.assert_close(prefill_attention(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1),
                                                 cache_k, cache_v, None, None), want_prefill)
    torch.testing.assert_close(prefill_attention(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1),
                                                 cache_k, cache_v, torch.arange(9), mask), want_cached)
    assert calls == [6, 6, 6, 6]
    use_kernels("cpu", KernelChoice(gqa="native"))  # and the stand-in really refuses enable_gqa
    with pytest.raises(RuntimeError, match="enable_gqa"):
        attention_ops.attention(q, k, v, is_causal=True)
