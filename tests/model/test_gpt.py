from __future__ import annotations

import math

import pytest
import torch
from gpt_testing import randomized, tiny_config

from portachat.model import GPT, GPTConfig


def test_logits_shape_and_dtype(tiny_model):
    idx = torch.randint(0, 128, (3, 11))
    logits = tiny_model(idx)
    assert logits.shape == (3, 11, 128) and logits.dtype == torch.float32


@pytest.mark.parametrize("tied", [False, True])
def test_loss_at_init_is_about_ln_vocab(tied):
    cfg = GPTConfig.from_depth(2, vocab_size=512, max_seq_len=64, tie_embeddings=tied)
    model = GPT(cfg)
    model.init_weights(seed=1)
    idx = torch.randint(0, 512, (4, 64), generator=torch.Generator().manual_seed(0))
    loss = model(idx, targets=idx.roll(-1, dims=1)).item()
    assert abs(loss - math.log(512)) < (0.05 if not tied else 0.3)


def test_init_weights_is_seeded_and_zeroes_output_projections():
    a, b = GPT(tiny_config()), GPT(tiny_config())
    a.init_weights(seed=3)
    b.init_weights(seed=3)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), name
    for block in a.model.layers:
        assert not block.self_attn.o_proj.weight.any() and not block.mlp.down_proj.weight.any()
        assert torch.equal(block.self_attn.q_norm.weight, torch.ones(16))
    q = a.model.layers[0].self_attn.q_proj.weight
    assert abs(q.std().item() - 1 / math.sqrt(64)) < 0.02


def test_loss_reductions_and_ignore_index(tiny_model):
    idx = torch.randint(0, 128, (2, 8))
    targets = idx.roll(-1, dims=1)
    targets[:, -3:] = -1
    per_token = tiny_model(idx, targets=targets, loss_reduction="none")
    assert per_token.shape == (2, 8)
    assert torch.all(per_token[:, -3:] == 0)
    total = tiny_model(idx, targets=targets, loss_reduction="sum")
    mean = tiny_model(idx, targets=targets)
    torch.testing.assert_close(total, per_token.sum())
    torch.testing.assert_close(mean, per_token.sum() / 10)
    logits = tiny_model(idx)
    manual = torch.nn.functional.cross_entropy(logits[:, :5].reshape(-1, 128), targets[:, :5].reshape(-1))
    torch.testing.assert_close(mean, manual)
    with pytest.raises(ValueError, match="loss_reduction must be"):
        tiny_model(idx, targets=targets, loss_reduction="avg")


def test_backward_reaches_every_parameter():
    model = randomized(GPT(tiny_config())).train()
    idx = torch.randint(0, 128, (2, 12))
    model(idx, targets=idx.roll(-1, dims=1)).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_fresh_model_trains():
    torch.manual_seed(0)
    model = GPT(tiny_config())
    model.init_weights(seed=0)
    data = torch.arange(128)[None, :33]  # a fixed sequence to memorise
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    first = None
    for _ in range(10):
        loss = model(data[:, :-1], targets=data[:, 1:])
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.3 * first


def test_causality(tiny_model):
    idx = torch.randint(0, 128, (1, 10))
    changed = idx.clone()
    changed[0, 6:] = (changed[0, 6:] + 1) % 128
    torch.testing.assert_close(tiny_model(idx)[:, :6], tiny_model(changed)[:, :6])


def test_parameter_names_match_qwen3():
    names = set(GPT(tiny_config()).state_dict())
    expected = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for i in range(2):
        p = f"model.layers.{i}."
        expected |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
        expected |= {
            p + f"self_attn.{n}.weight" for n in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")
        }
        expected |= {p + f"mlp.{n}.weight" for n in ("gate_proj", "up_proj", "down_proj")}
    assert names == expected  # rotary tables are non-persistent: not in the checkpoint


def test_tied_head_is_the_embedding():
    model = GPT(tiny_config(tie_embeddings=True))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.num_params() == tiny_config(tie_embeddings=True).num_params()


@pytest.mark.parametrize("tied", [False, True])
def test_param_groups_partition_parameters(tied):
    model = GPT(tiny_config(tie_embeddings=tied))
    groups = model.param_groups()
    grouped = [p for ps in groups.values() for p in ps]
    assert len({id(p) for p in grouped}) == len(grouped) == len(list(model.parameters()))
    assert all(p.dim() == 2 for p in groups["matrix"]) and len(groups["matrix"]) == 2 * 7
    assert all(p.dim() == 1 for p in groups["scalar"]) and len(groups["scalar"]) == 2 * 4 + 1
    assert groups["embedding"] == [model.model.embed_tokens.weight]
    assert groups["lm_head"] == ([] if tied else [model.lm_head.weight])


def test_flops_per_token_formula():
    cfg = GPTConfig.from_depth(12, vocab_size=65536)
    with torch.device("meta"):  # counting needs shapes only, not 186M real parameters
        model = GPT(cfg)
    layers = 12 * (4 * 768 * 768 + 3 * 768 * 2048 + 2 * 128 + 2 * 768)
    matmul_params = layers + 768 + 65536 * 768  # + final norm + lm_head; the input table is excluded
    assert model.num_params(exclude_embedding=True) == matmul_params
    assert model.flops_per_token(2048) == 6 * matmul_params + 12 * 12 * 6 * 128 * 2048
    # ~1 GFLOP per token for d12 at 2k context, 3/4 of it from the 6N term
    assert 0.9e9 < model.flops_per_token(2048) < 1.2e9
    assert model.flops_per_token(4096) - model.flops_per_token(2048) == 12 * 12 * 768 * 2048
    tiny = GPT(tiny_config(tie_embeddings=True))  # tied: the shared table does the head's matmul work
    assert tiny.flops_per_token(32) == 6 * tiny.num_params() + 12 * 2 * 4 * 16 * 32


def test_meta_device_then_to_empty_and_init():
    with torch.device("meta"):
        model = GPT(tiny_config(tie_embeddings=True))
    model.to_empty(device="cpu")
    model.init_weights(seed=0)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    reference = GPT(tiny_config(tie_embeddings=True))
    reference.init_weights(seed=0)
    idx = torch.randint(0, 128, (1, 9))
    torch.testing.assert_close(model(idx), reference(idx))


def test_bf16_model_keeps_fp32_rotary_and_returns_fp32_logits(tiny_model):
    idx = torch.randint(0, 128, (2, 9))
    reference = tiny_model(idx)
    half = tiny_model.to(torch.bfloat16)
    logits = half(idx)
    assert logits.dtype == torch.float32 and half.rope_cos.dtype == torch.float32
    assert (logits - reference).abs().max() < 0.25 * reference.abs().max()


def test_rotary_grows_past_max_seq_len():
    model = randomized(GPT(tiny_config(max_seq_len=8)))
    idx = torch.randint(0, 128, (1, 20))
    logits = model(idx)
    assert model.rope_cos.size(0) >= 20 and torch.isfinite(logits).all()
    reference = randomized(GPT(tiny_config(max_seq_len=32)))
    torch.testing.assert_close(logits, reference(idx))


def test_bad_input_shape(tiny_model):
    with pytest.raises(ValueError, match="idx must be a \\[batch, time\\] tensor"):
        tiny_model(torch.zeros(5, dtype=torch.long))
