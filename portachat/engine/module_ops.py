"""model/layer_ops.py's LayerOps over the model's own modules: the contract's reference.

The engine runs it where nothing is packed (accelerators, tensor-parallel shards, models still
training, quantized models whose products do not fuse). Every step is the module the training
forward (model/gpt.py's Block) calls, in the residual stream's dtype; only attention differs, reading
keys and values from the paged cache instead of the whole sequence.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from portachat.engine.packed_forward import CachedAttention
from portachat.model.gpt import GPT, apply_rotary


class ModuleLayerOps(CachedAttention):
    """The model's modules for one step; cos/sin are fp32 rotary tables [max_len, D]."""

    def __init__(self, model: GPT, inp, k_cache: torch.Tensor, v_cache: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor, dtype: torch.dtype) -> None:  # fmt: skip
        super().__init__(inp, k_cache, v_cache, dtype)
        self.blocks = model.model.layers
        self.cos = cos[inp.positions].to(dtype)[:, None, :]  # [N, 1, D]
        self.sin = sin[inp.positions].to(dtype)[:, None, :]

    def qkv(self, i: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        attn = self.blocks[i].self_attn
        h = self.blocks[i].input_layernorm(x)
        return attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)

    def qkv_input(self, i: int, x: torch.Tensor) -> torch.Tensor:
        return self.blocks[i].input_layernorm(x)

    def rope(self, i: int, qkv: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        attn = self.blocks[i].self_attn
        H, H_kv, D = attn.n_head, attn.n_kv_head, attn.head_dim
        q, k, v = qkv
        N = q.size(0)
        q = attn.q_norm(q.reshape(N, H, D))
        k = attn.k_norm(k.reshape(N, H_kv, D))
        return apply_rotary(q, self.cos, self.sin), apply_rotary(k, self.cos, self.sin), v.reshape(N, H_kv, D)

    def o(self, i: int, y: torch.Tensor) -> torch.Tensor:
        return self.blocks[i].self_attn.o_proj(y)

    def gate_up(self, i: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mlp = self.blocks[i].mlp
        h = self.blocks[i].post_attention_layernorm(x)
        return mlp.gate_proj(h), mlp.up_proj(h)

    def gate_up_input(self, i: int, x: torch.Tensor) -> torch.Tensor:
        return self.blocks[i].post_attention_layernorm(x)

    def swiglu(self, gate_up: tuple[torch.Tensor, ...]) -> torch.Tensor:
        gate, up = gate_up
        return F.silu(gate) * up

    def down(self, i: int, act: torch.Tensor) -> torch.Tensor:
        return self.blocks[i].mlp.down_proj(act)
