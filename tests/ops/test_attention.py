"""SDPA default path, and the Ascend fast path checked against SDPA through a reference fake kernel."""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn.functional as F

from portachat.device.fused_attention import current_backend, fusion_eligible, npu_fusion, select_backend
from portachat.ops.attention import attention


def _reference_fusion(
    q, k, v, head_num, input_layout, *, atten_mask=None, scale=1.0, keep_prob=1.0, sparse_mode=0
):
    """npu_fusion_attention's documented semantics: BNSD, masks True = masked out, sparse_mode 2 = top-left causal."""
    assert input_layout == "BNSD" and head_num == q.size(1) and keep_prob == 1.0
    sq, skv = q.size(2), k.size(2)
    if sparse_mode == 2:
        assert atten_mask.shape == (2048, 2048)
        masked = torch.ones(sq, skv, dtype=torch.bool).triu(1)
    else:
        assert sparse_mode == 0
        masked = atten_mask
    rep = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = (q @ k.transpose(-1, -2)) * scale
    if masked is not None:
        scores = scores.masked_fill(masked, float("-inf"))
    return (scores.softmax(-1) @ v, None, None, None)


@pytest.fixture
def fake_torch_npu(monkeypatch):
    mod = types.ModuleType("torch_npu")
    mod.npu_fusion_attention = _reference_fusion
    monkeypatch.setitem(sys.modules, "torch_npu", mod)


def _qkv(tq=7, tk=7, heads=4, kv_heads=2):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, heads, tq, 16, generator=g)
    k = torch.randn(2, kv_heads, tk, 16, generator=g)
    v = torch.randn(2, kv_heads, tk, 16, generator=g)
    return q, k, v


def test_sdpa_path_handles_gqa():
    q, k, v = _qkv()
    out = attention(q, k, v, is_causal=True)
    ref = F.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True
    )
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize(("tq", "tk"), [(7, 7), (3, 9)])
def test_npu_fusion_matches_sdpa_causal(fake_torch_npu, tq, tk):
    q, k, v = _qkv(tq, tk)
    torch.testing.assert_close(npu_fusion(q, k, v, is_causal=True), attention(q, k, v, is_causal=True))


def test_npu_fusion_matches_sdpa_with_boolean_mask(fake_torch_npu):
    q, k, v = _qkv(5, 8)
    keep = torch.rand(5, 8, generator=torch.Generator().manual_seed(1)) > 0.3
    keep[:, 0] = True  # every query attends somewhere
    torch.testing.assert_close(
        npu_fusion(q, k, v, is_causal=False, attn_mask=keep),
        attention(q, k, v, is_causal=False, attn_mask=keep),
    )


def test_fast_path_only_where_the_kernel_applies():
    assert fusion_eligible("npu", torch.bfloat16, 128, None)
    assert not fusion_eligible("npu", torch.float32, 128, None)
    assert not fusion_eligible("npu", torch.float16, 72, None)
    assert not fusion_eligible("cpu", torch.bfloat16, 128, None)
    assert not fusion_eligible("npu", torch.bfloat16, 64, torch.ones(2, 2, 2, dtype=torch.bool))


def test_backend_selection_leaves_cpu_tensors_on_sdpa():
    q, k, v = _qkv()
    before = current_backend()
    try:
        select_backend("npu_fusion_attention")
        out = attention(q, k, v, is_causal=True)  # CPU tensors: not eligible, SDPA answers
    finally:
        select_backend(before)
    torch.testing.assert_close(out, attention(q, k, v, is_causal=True))


def test_packed_causal_mask_keeps_each_sequence_to_itself():
    from portachat.ops.attention import packed_causal_mask

    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 6, 7, 8]])
    mask = packed_causal_mask(positions)
    assert mask.shape == (2, 1, 9, 9) and mask.dtype == torch.bool
    segment = [0, 0, 0, 1, 1, 2, 2, 2, 2]
    for i in range(9):
        for j in range(9):
            assert mask[0, 0, i, j] == (j <= i and segment[i] == segment[j]), (i, j)
    assert torch.equal(mask[1, 0], torch.ones(9, 9, dtype=torch.bool).tril())  # one sequence: plain causal
    q, k, v = _qkv(tq=9, tk=9)
    # Through attention() (True = attend): a row of one sequence is exactly is_causal.
    torch.testing.assert_close(attention(q, k, v, is_causal=False, attn_mask=mask)[1],
                               attention(q, k, v, is_causal=True)[1])
