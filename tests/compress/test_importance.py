"""Minitron importance finds what a model does not use: a block that is the identity, an MLP neuron
that never fires, a KV group whose values are zero, a hidden channel every norm silences."""

from __future__ import annotations

import torch

from portachat.compress.importance import measure_importance
from portachat.model import GPT
from tests.model.gpt_testing import randomized, tiny_config


def _batches(model: GPT) -> list[torch.Tensor]:
    """Text the model itself writes (sampled): no other model predicts it better in expectation, so
    removing a block that does anything raises the loss (on random tokens it could lower it)."""
    generator = torch.Generator().manual_seed(1)
    idx = torch.randint(0, model.config.vocab_size, (8, 1), generator=generator)
    for _ in range(32):
        probs = torch.softmax(model(idx)[:, -1], dim=-1)
        idx = torch.cat([idx, torch.multinomial(probs, 1, generator=generator)], dim=1)
    return list(idx.split(4))


def _model(**overrides) -> GPT:
    model = randomized(GPT(tiny_config(n_layer=4, **overrides)))
    model.requires_grad_(False)
    return model


def test_identity_block_is_least_important_by_loss_and_cosine():
    model = _model()
    useless = model.model.layers[2]
    useless.self_attn.o_proj.weight.zero_()
    useless.mlp.down_proj.weight.zero_()  # the block adds nothing to the residual stream
    imp = measure_importance(model, _batches(model))
    assert imp.block_loss is not None and int(imp.block_loss.argmin()) == 2
    assert abs(float(imp.block_loss[2])) < 1e-5 and float(imp.block_loss.min()) < float(imp.block_loss[[0, 1, 3]].min())
    assert int(imp.block_cosine.argmin()) == 2 and abs(float(imp.block_cosine[2])) < 1e-5
    assert imp.tokens == 8 * 32 and imp.base_loss > 0


def test_dead_neuron_head_group_and_channel_score_lowest():
    model = _model()
    block = model.model.layers[1]
    block.mlp.gate_proj.weight[7].zero_()  # silu(0) = 0: neuron 7 never fires
    block.self_attn.v_proj.weight[16:32].zero_()  # KV group 1 holds zero values: heads 2 and 3 output nothing
    for norm in [model.model.norm, *(m for b in model.model.layers for m in (b.input_layernorm,
                                                                            b.post_attention_layernorm))]:
        norm.weight[5] = 0.0  # every norm silences hidden channel 5
    imp = measure_importance(model, _batches(model), depth_metric="cosine")
    assert imp.block_loss is None
    assert int(imp.neurons[1].argmin()) == 7 and float(imp.neurons[1][7]) == 0.0
    assert set(torch.argsort(imp.heads[1])[:2].tolist()) == {2, 3} and float(imp.heads[1][2:].max()) == 0.0
    assert float(imp.heads[0].min()) > 0
    assert int(imp.channels.argmin()) == 5 and float(imp.channels[5]) == 0.0
