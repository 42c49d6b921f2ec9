"""Structured pruning: drop whole blocks (depth) and slice MLP neurons, attention heads, KV groups
and hidden channels (width), keeping the parts `importance.py` measured as mattering most.

The result is a GPT of the same family with a smaller config (num_hidden_layers, intermediate_size,
num_attention_heads, num_key_value_heads, hidden_size; head_dim is kept), so the HF directory it is
saved as loads in transformers and llama.cpp as any model of that family. Slicing is done on the
HF-named state dict and rebuilt through the model loader, which checks every name and shape.

Grouped-query attention: query head h reads KV group h // (n_head / n_kv_head), as in transformers'
repeat_kv. KV groups are pruned whole (by the summed importance of their query heads), then the
same number of query heads is kept inside each surviving group, so the layout stays valid. QK-norm
weights act on head_dim and are unchanged; RMSNorm weights follow the kept hidden channels.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch

from portachat.compress.importance import Importance
from portachat.i18n import _
from portachat.model.config import GPTConfig
from portachat.model.gpt import GPT
from portachat.model.load import build_model


class PruneError(ValueError):
    """Pruning targets this model cannot take; the message says which flag and what is allowed."""


@dataclass
class PruneTargets:
    """The size to prune to; None keeps that dimension (the names of NeMo's / ModelOpt's Minitron options)."""

    num_layers: int | None = None
    ffn_hidden_size: int | None = None
    num_attention_heads: int | None = None
    num_query_groups: int | None = None  # KV heads
    hidden_size: int | None = None

    def any(self) -> bool:
        return any(v is not None for v in asdict(self).values())


# target field -> (flag, GPTConfig field)
_LIMITS = {
    "num_layers": ("--target-num-layers", "n_layer"),
    "ffn_hidden_size": ("--target-ffn-hidden-size", "intermediate_size"),
    "num_attention_heads": ("--target-num-attention-heads", "n_head"),
    "num_query_groups": ("--target-num-query-groups", "n_kv_head"),
    "hidden_size": ("--target-hidden-size", "n_embd"),
}


def pruned_config(cfg: GPTConfig, targets: PruneTargets) -> GPTConfig:
    """The config after pruning to `targets`; refuses impossible targets before any work is done."""
    for name, (flag, field) in _LIMITS.items():
        value = getattr(targets, name)
        if value is None:
            continue
        have = getattr(cfg, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PruneError(_("{flag} must be a positive integer, got {value}").format(flag=flag, value=repr(value)))
        if value > have:
            raise PruneError(_("{flag} {value} is larger than the model's {have}: pruning only makes a model "
                               "smaller; pass at most {have}").format(flag=flag, value=value, have=have))
    heads_per_group = cfg.n_head // cfg.n_kv_head
    groups = targets.num_query_groups or cfg.n_kv_head
    if targets.num_attention_heads is None:
        heads = groups * heads_per_group
    else:
        heads = targets.num_attention_heads
        if heads % groups != 0:
            raise PruneError(
                _("--target-num-attention-heads {heads} does not divide into {groups} KV groups (grouped-query "
                  "attention needs the same number of query heads per group): pass a multiple of {groups}, or "
                  "change --target-num-query-groups").format(heads=heads, groups=groups))
        if heads // groups > heads_per_group:
            raise PruneError(
                _("{heads} query heads over {groups} KV groups needs {need} heads per group, but each group of "
                  "this model has only {have}; pass at most {most} heads or keep more groups").format(
                    heads=heads, groups=groups, need=heads // groups, have=heads_per_group,
                    most=groups * heads_per_group))
    return replace(
        cfg,
        n_layer=targets.num_layers or cfg.n_layer,
        n_embd=targets.hidden_size or cfg.n_embd,
        n_head=heads,
        n_kv_head=groups,
        intermediate_size=targets.ffn_hidden_size or cfg.intermediate_size,
    )


def _top(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k highest scores, in their original order (ties: the lower index wins)."""
    order = torch.argsort(scores, descending=True, stable=True)[:k]
    return torch.sort(order).values


@dataclass
class PrunePlan:
    """What is kept, as indices into the original model."""

    layers: list[int]
    channels: list[int]
    neurons: dict[int, list[int]]  # original layer -> kept MLP neurons
    heads: dict[int, list[int]]  # original layer -> kept query heads (group-major)
    groups: dict[int, list[int]]  # original layer -> kept KV groups


def plan_pruning(cfg: GPTConfig, importance: Importance, targets: PruneTargets, depth_metric: str = "loss") -> PrunePlan:
    new = pruned_config(cfg, targets)
    layers = _top(importance.blocks(depth_metric), new.n_layer).tolist()
    channels = _top(importance.channels, new.n_embd).tolist()
    per_group_old, per_group_new = cfg.n_head // cfg.n_kv_head, new.n_head // new.n_kv_head
    neurons, heads, groups = {}, {}, {}
    for i in layers:
        neurons[i] = _top(importance.neurons[i], new.intermediate_size).tolist()
        head_scores = importance.heads[i].view(cfg.n_kv_head, per_group_old)
        kept_groups = _top(head_scores.sum(dim=1), new.n_kv_head).tolist()
        groups[i] = kept_groups
        heads[i] = [g * per_group_old + int(h) for g in kept_groups for h in _top(head_scores[g], per_group_new)]
    return PrunePlan(layers=layers, channels=channels, neurons=neurons, heads=heads, groups=groups)


def _rows(index: list[int], size: int) -> torch.Tensor:
    """Row indices of whole heads/groups of `size` rows each."""
    return torch.tensor([i * size + r for i in index for r in range(size)], dtype=torch.long)


def pruned_state_dict(model: GPT, plan: PrunePlan) -> dict[str, torch.Tensor]:
    """The HF-named state dict of the pruned model (copies: the original model is left as it was)."""
    cfg = model.config
    state = model.state_dict()
    ch = torch.tensor(plan.channels, dtype=torch.long)
    out: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": state["model.embed_tokens.weight"][:, ch],
        "model.norm.weight": state["model.norm.weight"][ch],
    }
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = state["lm_head.weight"][:, ch]
    d = cfg.head_dim
    for new_i, old_i in enumerate(plan.layers):
        src, dst = f"model.layers.{old_i}.", f"model.layers.{new_i}."
        q_rows, kv_rows = _rows(plan.heads[old_i], d), _rows(plan.groups[old_i], d)
        nr = torch.tensor(plan.neurons[old_i], dtype=torch.long)
        out[dst + "input_layernorm.weight"] = state[src + "input_layernorm.weight"][ch]
        out[dst + "post_attention_layernorm.weight"] = state[src + "post_attention_layernorm.weight"][ch]
        out[dst + "self_attn.q_proj.weight"] = state[src + "self_attn.q_proj.weight"][q_rows][:, ch]
        out[dst + "self_attn.o_proj.weight"] = state[src + "self_attn.o_proj.weight"][ch][:, q_rows]
        for proj in ("k_proj", "v_proj"):
            out[dst + f"self_attn.{proj}.weight"] = state[src + f"self_attn.{proj}.weight"][kv_rows][:, ch]
        if cfg.attention_bias:
            out[dst + "self_attn.q_proj.bias"] = state[src + "self_attn.q_proj.bias"][q_rows]
            for proj in ("k_proj", "v_proj"):
                out[dst + f"self_attn.{proj}.bias"] = state[src + f"self_attn.{proj}.bias"][kv_rows]
        if cfg.qk_norm:  # over head_dim, shared by every head: unchanged
            for norm in ("q_norm", "k_norm"):
                out[dst + f"self_attn.{norm}.weight"] = state[src + f"self_attn.{norm}.weight"]
        out[dst + "mlp.gate_proj.weight"] = state[src + "mlp.gate_proj.weight"][nr][:, ch]
        out[dst + "mlp.up_proj.weight"] = state[src + "mlp.up_proj.weight"][nr][:, ch]
        out[dst + "mlp.down_proj.weight"] = state[src + "mlp.down_proj.weight"][ch][:, nr]
    return {k: v.clone() for k, v in out.items()}


def prune_model(model: GPT, importance: Importance, targets: PruneTargets, depth_metric: str = "loss"
                ) -> tuple[GPT, PrunePlan]:  # fmt: skip
    """A new, smaller GPT (same family, same device and dtype, eval mode) and the plan that made it."""
    plan = plan_pruning(model.config, importance, targets, depth_metric)
    new_cfg = pruned_config(model.config, targets)
    weight = model.model.embed_tokens.weight
    pruned = build_model(new_cfg, pruned_state_dict(model, plan), device=weight.device, dtype=weight.dtype,
                         where="pruned model")
    return pruned, plan
