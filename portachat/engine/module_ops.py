"""model/layer_ops.py's LayerOps over the model's own modules, for the engine's flat batch.

The engine runs it where nothing is packed (accelerators, tensor-parallel shards, models still
training, quantized models whose products do not fuse). Every product and norm is the module the
training forward calls (model/gpt.py's ModuleOps, shared); only the head layout (a flat batch of
tokens from many sequences) and attention (over the paged KV cache) are the engine's own.
"""

from __future__ import annotations

import torch

from portachat.engine.packed_forward import CachedAttention
from portachat.model.gpt import GPT, ModuleOps, apply_rotary


class ModuleLayerOps(ModuleOps, CachedAttention):
    """The model's modules for one step over x [N, C]; cos/sin are fp32 rotary tables [max_len, D]."""

    def __init__(self, model: GPT, inp, k_cache: torch.Tensor, v_cache: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor, dtype: torch.dtype) -> None:  # fmt: skip
        ModuleOps.__init__(self, model.model.layers)
        CachedAttention.__init__(self, inp, k_cache, v_cache, dtype)
        self.cos = cos[inp.positions].to(dtype)[:, None, :]  # [N, 1, D]
        self.sin = sin[inp.positions].to(dtype)[:, None, :]

    def rope(self, i: int, qkv: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        attn = self.blocks[i].self_attn
        H, H_kv, D = attn.n_head, attn.n_kv_head, attn.head_dim
        q, k, v = qkv
        N = q.size(0)
        q = attn.q_norm(q.reshape(N, H, D))
        k = attn.k_norm(k.reshape(N, H_kv, D))
        return apply_rotary(q, self.cos, self.sin), apply_rotary(k, self.cos, self.sin), v.reshape(N, H_kv, D)
