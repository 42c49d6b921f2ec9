"""The chunked loss: logits only at supervised positions, a chunk at a time, equal to the whole-logits
loss; padding and packing do not change a conversation's loss; packed conversations never see each other."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from gpt_testing import randomized, tiny_config
from torch.nn.attention.flex_attention import flex_attention

from portachat.device.fused_attention import KernelChoice, use_kernels
from portachat.model import GPT
from portachat.model.loss import chunked_cross_entropy, loss_chunk_size
from portachat.ops import attention as attention_ops
from portachat.ops.fast_path import set_enabled


def _whole_logits_loss(model: GPT, idx, targets, weights=None, reduction="sum"):
    """The loss as it was computed before: every position's logits in fp32, then cross-entropy."""
    logits = model.lm_head(model.hidden_states(idx)).float()
    per_token = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1,
                                reduction="none").view(targets.shape)
    if weights is not None:
        per_token = per_token * weights
    return {"sum": per_token.sum(), "none": per_token, "mean": per_token.sum() / (targets >= 0).sum()}[reduction]


def _grads(model: GPT) -> dict[str, torch.Tensor]:
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def _batch(rows=3, T=40, vocab=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, vocab, (rows, T), generator=g)
    targets = idx.roll(-1, dims=1)
    targets[:, : T // 3] = -1  # a prompt
    targets[1, -7:] = -1  # a shorter row
    return idx, targets


@pytest.mark.parametrize("chunk", [1, 7, 1000])  # one position per chunk, several chunks, a single chunk
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("path", ["fused", "checkpointed"])  # a plain linear head, or any other module
@pytest.mark.parametrize("tied", [False, True])
def test_chunked_loss_and_gradients_equal_the_whole_logits_ones(chunk, weighted, path, tied):
    model = randomized(GPT(tiny_config(tie_embeddings=tied)), std=0.1).train()
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    head = model.lm_head if path == "fused" else (lambda x: model.lm_head(x))
    idx, targets = _batch()
    weights = torch.rand(targets.shape, generator=torch.Generator().manual_seed(1)) - 0.3 if weighted else None
    count = int((targets >= 0).sum())  # the Trainer divides the summed loss by the supervised tokens
    reference = _whole_logits_loss(model, idx, targets, weights) / count
    reference.backward()
    expected = _grads(model)
    loss = chunked_cross_entropy(model.hidden_states(idx), head, targets, weights=weights, reduction="sum",
                                 chunk=chunk) / count
    loss.backward()
    got = _grads(model)
    assert abs(loss.item() - reference.item()) <= 1e-5
    assert got.keys() == expected.keys() and got
    for name in got:
        err = (got[name] - expected[name]).abs().max().item()
        assert err <= 1e-5 * max(1.0, expected[name].abs().max().item()), (name, err)


def test_reductions_and_no_supervised_token():
    model = randomized(GPT(tiny_config()))
    idx, targets = _batch()
    hidden = model.hidden_states(idx)
    for reduction in ("sum", "mean", "none"):
        got = chunked_cross_entropy(hidden, model.lm_head, targets, reduction=reduction, chunk=5)
        torch.testing.assert_close(got, _whole_logits_loss(model, idx, targets, reduction=reduction))
    nothing = torch.full_like(targets, -1)
    assert chunked_cross_entropy(hidden, model.lm_head, nothing, reduction="sum").item() == 0.0
    assert torch.all(chunked_cross_entropy(hidden, model.lm_head, nothing, reduction="none") == 0)
    with pytest.raises(ValueError, match="loss_reduction must be"):
        chunked_cross_entropy(hidden, model.lm_head, targets, reduction="avg")


def test_the_head_runs_on_supervised_positions_only_and_chunk_by_chunk():
    model = randomized(GPT(tiny_config()))
    idx, targets = _batch()
    rows_seen: list[int] = []
    model.lm_head.register_forward_hook(lambda _m, args, _out: rows_seen.append(args[0].shape[0]))
    with torch.no_grad():  # (training through the fused path reads the head's weight instead of calling it)
        model(idx, targets, loss_reduction="sum")
    supervised = int((targets >= 0).sum())
    assert sum(rows_seen) == supervised < targets.numel()
    rows_seen.clear()
    with torch.no_grad():
        chunked_cross_entropy(model.hidden_states(idx), model.lm_head, targets, chunk=16)
    assert rows_seen == [16] * (supervised // 16) + ([supervised % 16] if supervised % 16 else [])


def test_chunk_size_follows_the_vocabulary():
    assert loss_chunk_size(49152) == 1024  # SmolLM2: 192 MiB of fp32 logits per chunk
    assert loss_chunk_size(152064) == 256  # Qwen2.5: the smallest chunk
    assert loss_chunk_size(384) == 4096  # tiny vocabularies: the largest


def test_loss_is_the_same_padded_to_the_batch_or_to_2048():
    cfg = tiny_config(max_seq_len=2048)
    model = randomized(GPT(cfg), std=0.1).double().float()  # fp32
    idx, targets = _batch(T=40)
    padded_idx = torch.zeros(idx.size(0), 2048, dtype=torch.long)
    padded_targets = torch.full((idx.size(0), 2048), -1, dtype=torch.long)
    padded_idx[:, :40], padded_targets[:, :40] = idx, targets
    with torch.no_grad():
        short = model(idx, targets, loss_reduction="sum")
        long = model(padded_idx, padded_targets, loss_reduction="sum")
    assert abs(short.item() - long.item()) <= 1e-6 * max(1.0, abs(short.item())), (short.item(), long.item())


def _conversations(seed=3, lengths=(9, 14, 6), vocab=128):
    g = torch.Generator().manual_seed(seed)
    convs = []
    for n in lengths:
        ids = torch.randint(1, vocab, (n,), generator=g)
        targets = ids.roll(-1)
        targets[-1] = -1  # a conversation's last token predicts nothing
        targets[: n // 3] = -1  # its prompt
        convs.append((ids, targets))
    return convs


def _packed(convs):
    ids = torch.cat([c[0] for c in convs])[None]
    targets = torch.cat([c[1] for c in convs])[None]
    positions = torch.cat([torch.arange(len(c[0])) for c in convs])[None]
    return ids, targets, positions


def test_packed_conversations_give_the_same_losses_as_unpacked_ones():
    model = randomized(GPT(tiny_config(max_seq_len=64)), std=0.2)
    convs = _conversations()
    ids, targets, positions = _packed(convs)
    with torch.no_grad():
        packed = model(ids, targets, loss_reduction="none", positions=positions)[0]
        start = 0
        for conv_ids, conv_targets in convs:
            alone = model(conv_ids[None], conv_targets[None], loss_reduction="none")[0]
            torch.testing.assert_close(packed[start : start + len(conv_ids)], alone, atol=1e-6, rtol=1e-5)
            start += len(conv_ids)
        # Without positions the same row attends across conversations: the check above can fail.
        crossing = model(ids, targets, loss_reduction="none")[0]
    assert not torch.allclose(crossing, packed, atol=1e-4)


def test_no_token_attends_across_a_packed_boundary():
    model = randomized(GPT(tiny_config(max_seq_len=64)), std=0.2)
    convs = _conversations(lengths=(12, 10, 8))
    ids, _targets, positions = _packed(convs)
    changed = ids.clone()
    changed[0, :12] = (changed[0, :12] + 17) % 128  # every token of conversation A
    with torch.no_grad():
        before = model.hidden_states(ids, positions)
        after = model.hidden_states(changed, positions)
    assert not torch.allclose(before[0, :12], after[0, :12])  # A itself changes
    assert torch.equal(before[0, 12:], after[0, 12:])  # B and C do not move at all


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_packed_losses_are_the_same_through_flex_attention(monkeypatch):
    """Where the device layer chose flex, the model hands attention a document block mask: the losses
    are the dense mask's. Eager flex stands in for the compiled one (compiling on a CPU takes minutes;
    flex has no CPU backward, so forward only)."""
    calls = []

    def eager_flex(*args, **kwargs):
        calls.append(type(kwargs["block_mask"]).__name__)
        return flex_attention(*args, **kwargs)

    monkeypatch.setattr(attention_ops, "_compiled_flex", [eager_flex])
    model = randomized(GPT(tiny_config(max_seq_len=256)), std=0.2)
    ids, targets, positions = _packed(_conversations(lengths=(70, 45, 30)))  # 145 tokens: two flex blocks
    with torch.no_grad():
        dense = model(ids, targets, loss_reduction="none", positions=positions)[0]
        before = use_kernels("cpu", KernelChoice(packed="flex"))
        try:
            set_enabled("flex_attention", "cpu", True)  # as if its self-test passed here
            flex = model(ids, targets, loss_reduction="none", positions=positions)[0]
        finally:
            use_kernels("cpu", before)
            set_enabled("flex_attention", "cpu", None)
    assert calls == ["BlockMask"] * model.config.n_layer
    torch.testing.assert_close(flex, dense, atol=1e-5, rtol=1e-5)


def test_the_fused_path_keeps_nothing_of_vocabulary_size_for_the_backward():
    from portachat.device.memtrack import LiveTensorBytes

    model = randomized(GPT(tiny_config(vocab_size=4096)), std=0.1).train()
    model.requires_grad_(False)
    model.model.norm.weight.requires_grad_(True)  # something before the head trains, the head does not (LoRA)
    idx, targets = _batch(rows=8, T=128, vocab=4096)
    logits_bytes = int((targets >= 0).sum()) * 4096 * 4
    kept = {}
    for path, head in (("fused", model.lm_head), ("module", lambda x: model.lm_head(x))):
        hidden = model.hidden_states(idx)
        with LiveTensorBytes() as live:
            loss = chunked_cross_entropy(hidden, head, targets, reduction="sum")
            kept[path] = live.live  # alive between forward and backward (views of the weights counted too)
        loss.backward()
    assert kept["module"] >= logits_bytes > 4 * kept["fused"], (kept, logits_bytes)


def test_autocast_bf16_fused_loss_matches_the_module_path():
    model = randomized(GPT(tiny_config()), std=0.1).train()
    idx, targets = _batch()
    grads = []
    for head in (model.lm_head, lambda x: model.lm_head(x)):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = chunked_cross_entropy(model.hidden_states(idx), head, targets, reduction="mean", chunk=16)
        loss.backward()
        grads.append((loss.item(), _grads(model)))
    (a, ga), (b, gb) = grads
    assert abs(a - b) < 1e-2
    for name in ga:
        torch.testing.assert_close(ga[name], gb[name], atol=2e-2, rtol=5e-2, msg=name)


def test_supervised_positions_given_by_the_caller_give_the_same_loss():
    model = randomized(GPT(tiny_config()), std=0.1)
    idx, targets = _batch()
    keep = (targets.reshape(-1) >= 0).nonzero().squeeze(1)
    for reduction in ("sum", "none"):
        torch.testing.assert_close(model(idx, targets, loss_reduction=reduction, supervised=keep),
                                   model(idx, targets, loss_reduction=reduction))
