from __future__ import annotations

import pytest

from portachat.model import GPT, ConfigError, GPTConfig, training_tokens


def test_from_depth_nanochat_sizes():
    d4 = GPTConfig.from_depth(4, vocab_size=65537)
    assert (d4.n_layer, d4.n_embd, d4.n_head, d4.n_kv_head, d4.head_dim) == (4, 256, 2, 2, 128)
    assert d4.intermediate_size == 704  # ceil(8/3 * 256) = 683 -> next multiple of 64
    assert d4.vocab_size == 65600  # padded up to a multiple of 64

    d12 = GPTConfig.from_depth(12, vocab_size=65536)
    assert (d12.n_embd, d12.n_head, d12.head_dim, d12.intermediate_size) == (768, 6, 128, 2048)
    assert d12.vocab_size == 65536

    d20 = GPTConfig.from_depth(20, vocab_size=65536, max_seq_len=4096, kv_head_ratio=2)
    assert (d20.n_embd, d20.n_head, d20.n_kv_head, d20.head_dim, d20.intermediate_size) == (
        1280,
        10,
        5,
        128,
        3456,
    )
    assert d20.max_seq_len == 4096


@pytest.mark.parametrize("depth", [1, 2, 3, 5, 7, 9, 13])
def test_from_depth_small_and_odd_depths_keep_width_equal_heads_times_head_dim(depth):
    cfg = GPTConfig.from_depth(depth, vocab_size=300)
    assert cfg.n_embd == depth * 64 == cfg.n_head * cfg.head_dim
    assert cfg.head_dim % 2 == 0 and cfg.head_dim <= 256
    assert cfg.intermediate_size % 64 == 0 and cfg.intermediate_size >= 8 * cfg.n_embd / 3


def test_kv_head_ratio_picks_a_divisor():
    cfg = GPTConfig.from_depth(20, vocab_size=256, kv_head_ratio=3)  # 10 heads: 10 // 3 = 3 does not divide
    assert cfg.n_head == 10 and cfg.n_kv_head == 2


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"depth": 0}, "depth must be a positive integer"),
        ({"depth": -3}, "depth must be a positive integer"),
        ({"depth": 2.5}, "depth must be a positive integer"),
        ({"depth": 4, "vocab_size": 0}, "vocab_size must be a positive integer"),
        ({"depth": 4, "head_dim": 0}, "head_dim must be a positive integer"),
    ],
)
def test_from_depth_rejects_bad_numbers(kwargs, message):
    kwargs.setdefault("vocab_size", 256)
    with pytest.raises(ValueError, match=message):
        GPTConfig.from_depth(**kwargs)


def _tiny(**overrides) -> dict:
    base = dict(
        vocab_size=128, n_layer=2, n_embd=64, n_head=4, n_kv_head=2, head_dim=16, intermediate_size=160
    )
    base.update(overrides)
    return base


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"n_layer": 0}, "n_layer must be a positive integer"),
        ({"n_kv_head": 3}, "must be a multiple of n_kv_head"),
        ({"head_dim": 15}, "head_dim must be even"),
        ({"rope_theta": -1.0}, "rope_theta must be a positive number"),
        ({"rms_norm_eps": 0}, "rms_norm_eps must be a positive number"),
        ({"vocab_size": True}, "vocab_size must be a positive integer"),
    ],
)
def test_config_rejects_inconsistent_fields(overrides, message):
    with pytest.raises(ConfigError, match=message):
        GPTConfig(**_tiny(**overrides))


def test_dict_round_trip_and_unknown_fields():
    cfg = GPTConfig(**_tiny(tie_embeddings=True, rope_theta=5e5))
    assert GPTConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="unknown GPTConfig fields \\['n_heads'\\]"):
        GPTConfig.from_dict({**cfg.to_dict(), "n_heads": 4})


@pytest.mark.parametrize("tied", [False, True])
def test_formula_param_count_equals_model(tied):
    cfg = GPTConfig(**_tiny(tie_embeddings=tied))
    model = GPT(cfg)
    assert cfg.num_params() == model.num_params() == sum(p.numel() for p in model.parameters())
    assert cfg.num_params(exclude_embedding=True) == model.num_params(exclude_embedding=True)
    expected_drop = 0 if tied else 128 * 64
    assert model.num_params() - model.num_params(exclude_embedding=True) == expected_drop


def test_training_tokens_is_twenty_per_param():
    cfg = GPTConfig.from_depth(4, vocab_size=1024)
    assert training_tokens(cfg) == 20 * cfg.num_params()
    assert training_tokens(cfg, tokens_per_param=10.5) == int(10.5 * cfg.num_params())
    with pytest.raises(ConfigError, match="tokens_per_param must be positive"):
        training_tokens(cfg, tokens_per_param=0)
