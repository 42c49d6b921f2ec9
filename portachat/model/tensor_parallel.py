"""Tensor-parallel shards of a GPT: attention heads (with their KV cache) and MLP columns split over ranks.

Megatron's layout: q/k/v and gate/up are column-parallel (a rank computes its own heads and its own
slice of the hidden MLP, no communication), o_proj and down_proj are row-parallel (a rank's partial
product, summed over ranks by one all-reduce), so a layer costs two all-reduces of [tokens, n_embd].
Embeddings and norms (QK-norm included: its weight is per head_dim, shared by all heads) are
replicated. The LM head is vocab-parallel: each rank computes the logits of its own slice of the
vocabulary and one all-gather joins them (benchmarks/tp_lm_head.py: 1.4-1.8x faster than every rank
computing all logits, SmolLM2's head over 2 CPU ranks, and 1/N of the head's bytes per rank). A head
tied to the embeddings keeps its slice as a view of the (replicated) table: no extra memory.

Heads are split by kv group so that every rank keeps a uniform grouped-query layout (its q heads map
onto its kv heads as in the whole model). Ranks may own unequal numbers of groups (SmolLM2's 3 kv
heads over 2 ranks: 2 + 1): the sums are the same, only the work is uneven. With more ranks than kv
heads, each kv head is replicated on the ranks that share its group (vLLM's way).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from portachat.i18n import _
from portachat.model.config import ConfigError, GPTConfig
from portachat.model.gpt import GPT

# Hidden-MLP slices are cut on multiples of this where the size allows, so int4 groups (32, 64, 128
# input columns) of a row-parallel down_proj never straddle two ranks.
MLP_ALIGN = (128, 64, 32)


@dataclass(frozen=True)
class ShardPlan:
    rank: int
    world_size: int
    q_heads: range  # query heads this rank owns
    kv_heads: range  # kv heads it keeps (replicated across ranks when world_size > n_kv_head)
    mlp: range  # rows of gate/up (= columns of down) it owns
    vocab: range  # rows of the LM head (vocabulary entries) whose logits it computes


def _even(n: int, parts: int, index: int) -> range:
    """The index-th of `parts` contiguous, near-equal pieces of range(n) (the first ones one longer)."""
    base, extra = divmod(n, parts)
    start = index * base + min(index, extra)
    return range(start, start + base + (1 if index < extra else 0))


def _fits(cfg: GPTConfig, world: int) -> bool:
    heads, kv = cfg.n_head, cfg.n_kv_head
    if world <= kv:
        return True
    return world % kv == 0 and (heads // kv) % (world // kv) == 0


def working_sizes(cfg: GPTConfig, up_to: int = 64) -> list[int]:
    """Tensor-parallel sizes (up to `up_to`) this model's heads can be split into."""
    return [n for n in range(1, up_to + 1) if _fits(cfg, n) and cfg.intermediate_size >= n]


def plan_shard(cfg: GPTConfig, rank: int, world_size: int) -> ShardPlan:
    """Which heads and MLP rows `rank` of `world_size` owns; ConfigError naming the sizes that work."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a tensor-parallel group of {world_size}")
    if not _fits(cfg, world_size) or cfg.intermediate_size < world_size:
        sizes = ", ".join(map(str, working_sizes(cfg, up_to=max(16, world_size))))
        raise ConfigError(
            _("--tensor-parallel-size {size} cannot split this model's {n_head} query heads over "
              "{n_kv_head} kv heads (groups of {group}); sizes that work: {sizes}").format(
                size=world_size, n_head=cfg.n_head, n_kv_head=cfg.n_kv_head, group=cfg.n_head // cfg.n_kv_head,
                sizes=sizes)
        )
    group = cfg.n_head // cfg.n_kv_head
    if world_size <= cfg.n_kv_head:
        kv = _even(cfg.n_kv_head, world_size, rank)
        q = range(kv.start * group, kv.stop * group)
    else:  # more ranks than kv heads: `share` ranks split one group's q heads, each keeps its kv head
        share = world_size // cfg.n_kv_head
        head = rank // share
        kv = range(head, head + 1)
        per = group // share
        start = head * group + (rank % share) * per
        q = range(start, start + per)
    size = cfg.intermediate_size
    align = next((a for a in MLP_ALIGN if size % a == 0 and size // a >= world_size), 1)
    units = _even(size // align, world_size, rank)
    per = -(-cfg.vocab_size // world_size)  # equal slices but the last: the gathered logits are in order
    vocab = range(min(rank * per, cfg.vocab_size), min((rank + 1) * per, cfg.vocab_size))
    return ShardPlan(rank, world_size, q, kv, range(units.start * align, units.stop * align), vocab)


class RowParallelLinear(nn.Module):
    """A row-parallel product: this rank's partial x_r W_r^T, summed over the group by one all-reduce.

    Holds the shard as `.linear`, so weight-only quantization (portachat.quant) can replace it in place.
    """

    def __init__(self, linear: nn.Module, group=None) -> None:
        super().__init__()
        self.linear = linear
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        dist.all_reduce(y, group=self.group)
        return y


class VocabParallelHead(nn.Module):
    """The LM head over this rank's slice of the vocabulary; the logits of every rank are all-gathered
    (each slice padded to `rows_per_rank`, the last ones being shorter) and returned whole.

    Holds the slice as `.linear`, so weight-only quantization (portachat.quant) can replace it in place.
    """

    def __init__(self, linear: nn.Module, vocab_size: int, rows_per_rank: int, group=None) -> None:
        super().__init__()
        self.linear = linear
        self.vocab_size, self.rows_per_rank, self.group = vocab_size, rows_per_rank, group

    @property
    def weight(self) -> torch.Tensor | None:
        return getattr(self.linear, "weight", None)  # never the embedding table itself: not "tied"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        pad = self.rows_per_rank - y.size(-1)
        y = torch.nn.functional.pad(y, (0, pad)) if pad else y.contiguous()
        parts = [torch.empty_like(y) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(parts, y, group=self.group)
        return torch.cat(parts, dim=-1)[..., : self.vocab_size]


def _slice_linear(linear: nn.Linear, rows: slice | None = None, cols: slice | None = None,
                  keep_bias: bool = True, copy: bool = True) -> nn.Linear:  # fmt: skip
    """The slice as a new module; `copy=False` keeps it a view of the whole weight."""
    w = linear.weight.detach()
    w = w[rows] if rows is not None else w
    w = w[:, cols] if cols is not None else w
    bias = linear.bias is not None and keep_bias
    out = nn.Linear(w.size(1), w.size(0), bias=bias, device="meta", dtype=w.dtype)
    out.weight = nn.Parameter(w.clone() if copy else w, requires_grad=False)
    if bias:
        b = linear.bias.detach()
        out.bias = nn.Parameter((b[rows] if rows is not None else b).clone(), requires_grad=False)
    return out


@torch.no_grad()
def shard_model(model: GPT, rank: int, world_size: int, group=None) -> ShardPlan:
    """Cut `model` (whole weights, any device) down to `rank`'s shard, in place.

    Afterwards `model.config` describes the shard (its heads and MLP width: the engine sizes this
    rank's KV cache from it) and `model.tensor_parallel` holds the plan; the forward needs the
    process group (`group`, default: the default group; kept as `model.tensor_parallel_group`) to be up.
    """
    if getattr(model, "tensor_parallel", None) is not None:
        raise ValueError("the model is already sharded")
    if any(not isinstance(m, nn.Linear) for n, m in model.named_modules() if n.endswith("_proj")):
        raise ValueError("shard the model before quantizing it (its projections are no longer nn.Linear)")
    cfg = model.config
    plan = plan_shard(cfg, rank, world_size)
    D = cfg.head_dim
    q = slice(plan.q_heads.start * D, plan.q_heads.stop * D)
    kv = slice(plan.kv_heads.start * D, plan.kv_heads.stop * D)
    mlp = slice(plan.mlp.start, plan.mlp.stop)
    for block in model.model.layers:
        attn, ff = block.self_attn, block.mlp
        attn.q_proj = _slice_linear(attn.q_proj, rows=q)
        attn.k_proj = _slice_linear(attn.k_proj, rows=kv)
        attn.v_proj = _slice_linear(attn.v_proj, rows=kv)
        # A row-parallel bias is added once (rank 0), not once per rank.
        attn.o_proj = RowParallelLinear(_slice_linear(attn.o_proj, cols=q, keep_bias=rank == 0), group)
        attn.n_head, attn.n_kv_head = len(plan.q_heads), len(plan.kv_heads)
        ff.gate_proj = _slice_linear(ff.gate_proj, rows=mlp)
        ff.up_proj = _slice_linear(ff.up_proj, rows=mlp)
        ff.down_proj = RowParallelLinear(_slice_linear(ff.down_proj, cols=mlp, keep_bias=rank == 0), group)
    head = model.lm_head
    rows = slice(plan.vocab.start, plan.vocab.stop)
    tied = head.weight is model.model.embed_tokens.weight  # then a view of the table every rank keeps
    sliced = _slice_linear(head, rows=rows, copy=not tied)
    model.lm_head = VocabParallelHead(sliced, cfg.vocab_size, -(-cfg.vocab_size // world_size), group)
    model.config = dataclasses.replace(
        cfg, n_head=len(plan.q_heads), n_kv_head=len(plan.kv_heads), intermediate_size=len(plan.mlp)
    )
    model.full_config = cfg
    model.tensor_parallel = plan
    model.tensor_parallel_group = group
    return plan
