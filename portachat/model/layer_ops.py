"""One decoder layer, written once: the forward contract training and every inference path implement.

A layer of the GPT (model/gpt.py's Block) over the residual stream x (the engine's flat batch [N, C],
training's sequences [B, T, C]):

    qkv      = [q|k|v](input_norm(x))      one product, q/k/v biases included
    q, k     = rope(qk_norm(q), qk_norm(k)) at each token's own position (QK-norm: Qwen3 only)
    y        = attention(q, k, v)          over the sequence so far (the engine's KV cache: written first)
    x        = x + o(y)
    gate, up = [gate|up](post_norm(x))     one product
    x        = x + down(silu(gate) * up)

`LayerOps` is what an implementation supplies, step by step; `decoder_layer` puts the steps in that
order and is the one place LoRA adapters join the products (each adapter's B (A h) added to its own
rows of a product's output, h the product's normalised input; model/lora_batch.py). Implementations:

- the model's own modules (model/gpt.py's ModuleOps): SequenceOps for whole sequences, which is how
  Block.forward, and so training, runs a layer; the engine's ModuleLayerOps (engine/module_ops.py)
  over its paged KV cache, the path of accelerators, models still training and quantized models
  whose products do not fuse;
- the packed CPU products (engine/packed_forward.py's PackedLayerOps): norm weights folded into the
  products, fp32 rotary and attention, fewer and larger operations;
- the C decode step (ops/kernels/decode_step.c through PackedModel.forward_decode): the same sequence
  for every layer in one call, with no Python steps to plug in. Its speed is the point, so it stays
  as it is and tests pin it to this contract (tests/engine/test_layer_contract.py compares every
  engine path's logits with the model's plain forward, with and without a LoRA adapter).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:  # the model's own forward passes no adapters: it need not load their code
    from portachat.model.lora_batch import AdapterSet, Groups

# A fused product's output: one tensor, or its modules' outputs side by side (q, k, v / gate, up)
# where the implementation runs them apart (no copy to join them).
Product = torch.Tensor | tuple[torch.Tensor, ...]


class LayerOps(Protocol):
    """The steps of layer `i` for one forward step (an implementation is bound to the step's inputs)."""

    def qkv(self, i: int, x: torch.Tensor) -> Product:
        """q, k, v of the input-normalised residual stream, biases included."""

    def qkv_input(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """What the q/k/v product reads: input_norm(x) (asked only when an adapter needs it)."""

    def rope(self, i: int, qkv: Product) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v split into heads, q and k QK-normed and rotated at each token's position."""

    def attend(self, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Every token's attention over its sequence so far (the engine writes k and v to its cache
        first), heads joined again ([..., H * D]) in the residual stream's dtype."""

    def o(self, i: int, y: torch.Tensor) -> torch.Tensor:
        """The output projection."""

    def gate_up(self, i: int, x: torch.Tensor) -> Product:
        """gate and up of the post-attention-normalised residual stream."""

    def gate_up_input(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """What the gate/up product reads: post_norm(x) (asked only when an adapter needs it)."""

    def swiglu(self, gate_up: Product) -> torch.Tensor:
        """silu(gate) * up, in the dtype the down product reads."""

    def down(self, i: int, act: torch.Tensor) -> torch.Tensor:
        """The down projection."""


def decoder_layer(ops: LayerOps, i: int, x: torch.Tensor, adapters: AdapterSet | None = None,
                  groups: Groups | None = None) -> torch.Tensor:  # fmt: skip
    """Layer `i` over the residual stream x; `groups` (adapter slot, rows) say which rows run
    which of `adapters` (none: every row is the base model, and no adapter work is done)."""
    qkv = ops.qkv(i, x)
    if groups:
        adapters.add_to(qkv, ops.qkv_input(i, x), i, "qkv", groups)
    q, k, v = ops.rope(i, qkv)
    y = ops.attend(i, q, k, v)
    o = ops.o(i, y)
    if groups:
        adapters.add_to(o, y, i, "o", groups)
    x = x + o
    gate_up = ops.gate_up(i, x)
    if groups:
        adapters.add_to(gate_up, ops.gate_up_input(i, x), i, "gate_up", groups)
    act = ops.swiglu(gate_up)
    down = ops.down(i, act)
    if groups:
        adapters.add_to(down, act, i, "down", groups)
    return x + down
