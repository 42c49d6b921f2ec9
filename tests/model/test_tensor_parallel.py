"""How a GPT is cut into tensor-parallel shards: which heads and MLP rows each rank owns, and that the
shards partition (or, for replicated kv heads, repeat) the whole weights exactly."""

from __future__ import annotations

import pytest
import torch
from gpt_testing import randomized, tiny_config

from portachat.model import GPT
from portachat.model.config import ConfigError
from portachat.model.tensor_parallel import RowParallelLinear, plan_shard, shard_model, working_sizes


def _plans(cfg, world):
    return [plan_shard(cfg, r, world) for r in range(world)]


def test_even_split_gives_each_rank_whole_kv_groups():
    cfg = tiny_config(n_head=4, n_kv_head=2, intermediate_size=256)
    a, b = _plans(cfg, 2)
    assert (a.q_heads, a.kv_heads, b.q_heads, b.kv_heads) == (
        range(0, 2),
        range(0, 1),
        range(2, 4),
        range(1, 2),
    )
    assert (a.mlp, b.mlp) == (range(0, 128), range(128, 256))


def test_kv_heads_that_do_not_divide_split_unevenly_smollm2_layout():
    cfg = tiny_config(n_embd=576, n_head=9, n_kv_head=3, head_dim=64, intermediate_size=1536)
    a, b = _plans(cfg, 2)
    assert (a.kv_heads, b.kv_heads) == (range(0, 2), range(2, 3))
    assert (a.q_heads, b.q_heads) == (range(0, 6), range(6, 9))
    assert len(a.mlp) + len(b.mlp) == 1536 and len(a.mlp) % 128 == 0  # int4 groups never straddle ranks


def test_more_ranks_than_kv_heads_replicate_them():
    cfg = tiny_config(n_head=8, n_kv_head=2, head_dim=8)
    plans = _plans(cfg, 4)
    assert [p.kv_heads for p in plans] == [range(0, 1), range(0, 1), range(1, 2), range(1, 2)]
    assert [p.q_heads for p in plans] == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]


def test_impossible_size_names_the_sizes_that_work():
    cfg = tiny_config(n_head=4, n_kv_head=2)
    assert working_sizes(cfg, up_to=8) == [1, 2, 4]
    with pytest.raises(
        ConfigError,
        match=r"--tensor-parallel-size 3 .*4 query heads over 2 kv heads.*sizes that work: 1, 2, 4",
    ):
        plan_shard(cfg, 0, 3)


@pytest.mark.parametrize("overrides,world", [
    (dict(n_head=4, n_kv_head=2, attention_bias=True, qk_norm=False), 2),
    (dict(n_head=6, n_kv_head=3, head_dim=16, n_embd=96), 2),
    (dict(n_head=8, n_kv_head=2, head_dim=8), 4),
])  # fmt: skip
def test_shards_partition_the_weights(overrides, world):
    whole = randomized(GPT(tiny_config(**overrides)))
    cfg = whole.config
    shards = []
    for rank in range(world):
        model = randomized(GPT(tiny_config(**overrides)))  # same seed: the same weights
        shard_model(model, rank, world)
        shards.append(model)
    D = cfg.head_dim
    for i, block in enumerate(whole.model.layers):
        layers = [s.model.layers[i] for s in shards]
        q = torch.cat([b.self_attn.q_proj.weight for b in layers])
        o = torch.cat([b.self_attn.o_proj.linear.weight for b in layers], dim=1)
        up = torch.cat([b.mlp.up_proj.weight for b in layers])
        down = torch.cat([b.mlp.down_proj.linear.weight for b in layers], dim=1)
        assert torch.equal(q, block.self_attn.q_proj.weight) and torch.equal(o, block.self_attn.o_proj.weight)
        assert torch.equal(up, block.mlp.up_proj.weight) and torch.equal(down, block.mlp.down_proj.weight)
        for rank, b in enumerate(layers):
            kv = plan_shard(cfg, rank, world).kv_heads
            rows = slice(kv.start * D, kv.stop * D)
            assert torch.equal(b.self_attn.k_proj.weight, block.self_attn.k_proj.weight[rows])
            if cfg.attention_bias:
                assert torch.equal(b.self_attn.v_proj.bias, block.self_attn.v_proj.bias[rows])
            assert isinstance(b.self_attn.o_proj, RowParallelLinear)
            assert b.self_attn.n_head * D == b.self_attn.q_proj.out_features
    for rank, s in enumerate(shards):  # the shard's config sizes its KV cache: its own kv heads only
        plan = plan_shard(cfg, rank, world)
        assert (s.config.n_head, s.config.n_kv_head) == (len(plan.q_heads), len(plan.kv_heads))
        assert s.full_config == cfg and torch.equal(
            s.lm_head.weight, whole.lm_head.weight[plan.vocab.start : plan.vocab.stop]
        )
    # the vocab-parallel head: every rank's rows, in order, are the whole head
    assert torch.equal(torch.cat([s.lm_head.weight for s in shards]), whole.lm_head.weight)


def test_a_model_is_sharded_once():
    model = GPT(tiny_config())
    shard_model(model, 0, 2)
    with pytest.raises(ValueError, match="already sharded"):
        shard_model(model, 0, 2)


def test_a_tied_head_slices_the_table_without_a_copy():
    model = randomized(GPT(tiny_config(tie_embeddings=True)))
    table = model.model.embed_tokens.weight
    plan = shard_model(model, 1, 2)
    head = model.lm_head.weight
    assert torch.equal(head, table[plan.vocab.start : plan.vocab.stop])
    assert head.untyped_storage().data_ptr() == table.untyped_storage().data_ptr()  # a view, no new memory


def test_vocab_slices_cover_the_vocabulary_in_order():
    cfg = tiny_config(vocab_size=130)  # not a multiple of the ranks: the last slice is shorter
    slices = [plan_shard(cfg, r, 4).vocab for r in range(4)]
    assert [list(v) for v in slices] == [list(range(0, 33)), list(range(33, 66)), list(range(66, 99)),
                                         list(range(99, 130))]  # fmt: skip
