"""SDPA default path, and the Ascend fast path checked against SDPA through a reference fake kernel."""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from portachat.device.fused_attention import KernelChoice, fusion_eligible, npu_fusion, use_kernels
from portachat.ops import attention as attention_ops
from portachat.ops.attention import (
    attention,
    document_block_mask,
    document_ids,
    packed_attention_mask,
    packed_causal_mask,
)
from portachat.ops.fast_path import set_enabled

EAGER_FLEX = "ignore:flex_attention called without torch.compile"  # the reference path, on purpose


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
    before = use_kernels("cpu", KernelChoice(attention="npu_fusion_attention"))
    try:
        out = attention(q, k, v, is_causal=True)  # CPU tensors: not eligible, SDPA answers
    finally:
        use_kernels("cpu", before)
    torch.testing.assert_close(out, attention(q, k, v, is_causal=True))


def test_packed_causal_mask_keeps_each_sequence_to_itself():
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


def _packed_positions():
    """Two rows of 150 tokens (more than flex's 128-token blocks): three sequences, the last one's
    padding continuing its positions; and one sequence with a short one after it."""
    return torch.tensor([list(range(60)) + list(range(50)) + list(range(40)), list(range(130)) + list(range(20))])


def test_document_ids_number_the_sequences_of_each_row():
    assert document_ids(torch.tensor([[0, 1, 2, 0, 1, 0, 0, 1], [0, 1, 2, 3, 4, 5, 6, 7]])).tolist() == [
        [1, 1, 1, 2, 2, 3, 4, 4], [1, 1, 1, 1, 1, 1, 1, 1]]
    with pytest.raises(ValueError, match="batch, time"):
        document_ids(torch.arange(4))


@pytest.mark.filterwarnings(EAGER_FLEX)
def test_flex_attention_with_the_document_block_mask_equals_sdpa_with_the_dense_mask():
    positions = _packed_positions()
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 150, 16, generator=g)
    k, v = torch.randn(2, 2, 150, 16, generator=g), torch.randn(2, 2, 150, 16, generator=g)  # grouped heads
    dense = attention(q, k, v, is_causal=False, attn_mask=packed_causal_mask(positions))
    flex = attention(q, k, v, is_causal=False, attn_mask=document_block_mask(document_ids(positions)))
    torch.testing.assert_close(flex, dense, atol=1e-5, rtol=1e-5)
    # and it is not plain causal attention: the first row's later sequences see nothing before them
    assert not torch.allclose(flex[0, :, 60:], attention(q, k, v, is_causal=True)[0, :, 60:], atol=1e-3)


def test_packed_rows_get_their_mask_in_the_form_the_device_layer_chose():
    positions = _packed_positions()
    before = use_kernels("cpu", KernelChoice(packed="flex"))
    try:
        set_enabled("flex_attention", "cpu", True)  # as if its self-test passed here (it runs where flex is chosen)
        block = packed_attention_mask(positions)
        assert isinstance(block, BlockMask) and block.shape == (2, 1, 150, 150)
        assert attention_ops._flex("cpu") is not flex_attention  # compiled where chosen (compiling waits for a call)
        use_kernels("cpu", KernelChoice(packed="dense_mask"))
        assert torch.equal(packed_attention_mask(positions), packed_causal_mask(positions))
        assert attention_ops._flex("cpu") is flex_attention  # a hand-built BlockMask elsewhere: the eager reference
        assert attention_ops._flex("cuda") is flex_attention  # and the choice of one device type is its own
        use_kernels("cpu", KernelChoice(packed="flex"))
        set_enabled("flex_attention", "cpu", False)  # its self-test failed: the dense mask, whatever was chosen
        assert torch.equal(packed_attention_mask(positions), packed_causal_mask(positions))
    finally:
        use_kernels("cpu", before)
        set_enabled("flex_attention", "cpu", None)
