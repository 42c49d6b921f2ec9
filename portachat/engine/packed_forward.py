"""The engine's forward over pre-packed weights (CPU): fewer, larger operations per layer.

At batch 1 a decode step reads every weight once (a few milliseconds of memory traffic for a
135M model) and then spends as long again dispatching the ~60 small operations per layer that
surround the products. This path removes most of them without changing the mathematics:

- q, k and v come out of one product, gate and up out of another. The fused weight is the only
  copy: the modules' own weights become views of it, so fusing costs no memory (the packed
  kernels' blocked layout is the one extra copy of each weight, see device.cpu_linear).
- RMSNorm is one reduction: its weight is folded into the packed product that follows it
  (W diag(w), device.cpu_linear) and its per-row scale 1/rms(x) multiplies the product's output:
  W(s x) = s (W x). The scaled output is fp32, so rotary, attention and the MLP's gate run in fp32
  with no casts in between. (Where nothing packs, bf16 without oneDNN's kernels, the weight
  multiplies the product's input instead: a folded copy would be a second weight.)
- The output head is not folded (the final norm's weight multiplies its few input rows): folding
  the largest matrix would need a transient copy of it while packing.
- Rotary turns q and k together (rotate_half as a roll with a sign folded into the sine table).
- Keys and values live in the cache in the dtype attention computes in (the device layer's
  choice), so reading them costs no conversion.
- Where every product runs on the device's own small-batch kernels (device.cpu_linear's
  RoutedLinear) and the step has few rows (decode rows, a speculative verification, a short
  prompt), all layers are one call (`forward_decode`, device.cpu_kernels.DecodeLayers): the norms,
  SwiGLU and residual adds fused into the products, rotary, the cache writes and attention in one.

The layer is model/layer_ops.py's contract: `forward` runs `decoder_layer` over PackedLayerOps,
`forward_decode` the C kernels' same sequence. Results equal the module path within floating-point
rounding (tests/engine/test_layer_contract.py compares every path with the model's forward).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from portachat.model.gpt import GPT
from portachat.model.layer_ops import decoder_layer
from portachat.model.lora_batch import AdapterSet
from portachat.ops import cpu_kernels, npu_attention
from portachat.ops import paged_attention as pa
from portachat.ops.cpu_linear import (
    RoutedLinear,
    fused_forward_available,
    pack_linear,
    small_batch_product,
)
from portachat.quant import Int4Linear, Int8Linear, model_device, model_dtype
from portachat.quant.fuse import fuse_rows, stack_rows

Linear = Callable[[torch.Tensor], torch.Tensor]
QUANTIZED = (Int8Linear, Int4Linear)  # portachat.quant's weight-only products


@dataclass
class PackedLayer:
    qkv: Linear  # input norm's weight folded in (pack_linear's in_scale)
    qkv_bias: torch.Tensor | None  # fp32, added after the norm scale
    o: Linear
    gate_up: Linear  # post-attention norm's weight folded in
    down: Linear
    eps_in: torch.Tensor  # [1] fp32
    eps_post: torch.Tensor
    q_norm: torch.nn.Module | None  # QK-norm (Qwen3), None when the model has none
    k_norm: torch.nn.Module | None


def _product(modules: list[torch.nn.Module], in_scale: torch.Tensor | None = None) -> Linear | None:
    """x -> the modules' outputs side by side for input x * in_scale, without the biases of a fused
    group (the forward adds those after the norm's scale); None where they cannot be fused."""
    if all(type(m) is torch.nn.Linear and type(m.weight) is torch.nn.Parameter for m in modules):
        if len(modules) == 1:
            return pack_linear(modules[0].weight, modules[0].bias, in_scale=in_scale)
        return pack_linear(stack_rows(modules, "weight"), in_scale=in_scale)
    if len(modules) == 1 and isinstance(modules[0], QUANTIZED) and in_scale is None:
        return _quantized(modules[0], None)
    fused = fuse_rows(modules)
    if fused is None:
        return None
    return _quantized(fused, in_scale)


def _quantized(module: torch.nn.Module, in_scale: torch.Tensor | None) -> Linear:
    """A quantized product of x * in_scale, the device's own kernel taking the batches it wins."""
    fallback = module if in_scale is None else lambda x: module(x * in_scale)
    n, k = module.out_features, module.in_features
    if isinstance(module, Int8Linear):
        return small_batch_product(fallback, "int8", module.qweight, n, k, scale=module.scale,
                                   in_scale=in_scale, bias=module.bias)  # fmt: skip
    scale, zero = module.group_scale_and_code0()
    return small_batch_product(fallback, "int4", module.packed, n, k, scale=scale, zero=zero,
                               group=module.group_size, in_scale=in_scale, bias=module.bias)  # fmt: skip


def _is_identity(module: torch.nn.Module) -> bool:
    return isinstance(module, torch.nn.Identity)


def _eps(norm: torch.nn.Module, device: torch.device) -> torch.Tensor:
    return torch.tensor([float(norm.eps)], dtype=torch.float32, device=device)


class PackedModel:
    """Fused (and, where the device packs, packed) products of a frozen GPT and the forward that uses
    them; `build` returns None where the device layer runs no fused forward or a layer's products
    cannot be fused (tensor-parallel shards, layers quantized only in part)."""

    def __init__(self, model: GPT, layers: list[PackedLayer], head: Linear, eps_final: torch.Tensor) -> None:
        self.model, self.layers, self.head, self.eps_final = model, layers, head, eps_final
        products = [p for layer in layers for p in (layer.qkv, layer.o, layer.gate_up, layer.down)] + [head]
        kernels_everywhere = all(isinstance(p, RoutedLinear) for p in products)
        # Rows up to which a decode step can run on the kernels alone (0: never).
        self.decode_rows = min(p.step_rows for p in products) if kernels_everywhere else 0
        if any(layer.q_norm is not None for layer in layers):
            self.decode_rows = 0  # QK-norm (Qwen3) sits between the product and rotary
        self.final_norm = model.model.norm.weight.detach().float().contiguous()
        self.final_eps = float(eps_final)
        self.decode_layers = None
        if self.decode_rows:
            self.decode_layers = cpu_kernels.DecodeLayers(
                cpu_kernels.library(),
                [(layer.qkv.kernel, layer.o.kernel, layer.gate_up.kernel, layer.down.kernel) for layer in layers],
                [layer.qkv_bias for layer in layers],
                [(float(layer.eps_in), float(layer.eps_post)) for layer in layers],
            )

    @classmethod
    def build(cls, model: GPT) -> PackedModel | None:
        device, dtype = model_device(model), model_dtype(model)
        if not fused_forward_available(device.type, dtype):
            return None  # before fusing anything: the modules stay as they are
        layers = []
        for block in model.model.layers:
            attn, mlp = block.self_attn, block.mlp
            w_in, w_post = block.input_layernorm.weight, block.post_attention_layernorm.weight
            qkv_b = None
            if attn.q_proj.bias is not None:
                qkv_b = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]).float()
            parts = (
                _product([attn.q_proj, attn.k_proj, attn.v_proj], in_scale=w_in),
                _product([attn.o_proj]),
                _product([mlp.gate_proj, mlp.up_proj], in_scale=w_post),
                _product([mlp.down_proj]),
            )
            if any(p is None for p in parts):
                return None  # e.g. tensor-parallel shards, or layers quantized only in part
            q_norm = None if _is_identity(attn.q_norm) else attn.q_norm
            k_norm = None if _is_identity(attn.k_norm) else attn.k_norm
            qkv, o, gate_up, down = parts
            layers.append(PackedLayer(qkv, qkv_b, o, gate_up, down, _eps(block.input_layernorm, device),
                                      _eps(block.post_attention_layernorm, device), q_norm, k_norm))  # fmt: skip
        final = model.model.norm
        # Unfolded: a folded head would need a transient copy of the largest matrix while packing (the
        # final norm's weight is applied to the logits rows' input instead, once per step).
        head = _product([model.lm_head])
        if head is None:
            return None
        return cls(model, layers, head, _eps(final, device))

    def forward(self, inp, k_cache: torch.Tensor, v_cache: torch.Tensor, cos: torch.Tensor,
                sin_signed: torch.Tensor, lora: AdapterSet | None = None) -> torch.Tensor:  # fmt: skip
        """fp32 logits [S, V] at `inp.logits_rows` (inp: runner.StepInputs). cos/sin_signed are the
        fp32 rotary tables [max_len, D], the sine's first half negated (rotate_half as a roll).
        `lora` holds the adapters `inp.lora_groups` refer to; their updates read the normalised
        input, which only their rows compute (the packed product folds the norm in)."""
        if self._decode_on_kernels(inp, k_cache):
            return self.forward_decode(inp, k_cache, v_cache, cos, sin_signed)
        model = self.model
        x = model.model.embed_tokens(inp.input_ids)  # [N, C]
        ops = PackedLayerOps(self, inp, k_cache, v_cache, cos, sin_signed, x)
        for i in range(len(self.layers)):
            x = decoder_layer(ops, i, x, lora, inp.lora_groups)
        x = x.index_select(0, inp.logits_rows)
        return self.head(x * model.model.norm.weight) * rms_scale(x, self.eps_final, ops.inv_c)

    def _decode_on_kernels(self, inp, k_cache) -> bool:
        n = inp.input_ids.size(0)
        return (0 < n <= self.decode_rows and not inp.lora_groups and type(k_cache) is torch.Tensor
                and k_cache.dtype == torch.float32 and k_cache.dim() == 4 and k_cache.is_contiguous())  # fmt: skip

    def forward_decode(self, inp, k_cache: torch.Tensor, v_cache: torch.Tensor, cos: torch.Tensor,
                       sin_signed: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """`forward` for a step of few rows, every product on the device's own kernels. Each row
        attends over its own slots: a decode row over its sequence, a row of a prefill chunk (a
        speculative verification, a short prompt) over its sequence up to itself."""
        slots, mask = rows_as_decode(inp)
        cfg = self.model.config
        x = self.model.model.embed_tokens(inp.input_ids).contiguous()  # [N, C], updated in place
        self.decode_layers(x, inp.positions.contiguous(), cos.contiguous(), sin_signed.contiguous(), k_cache,
                           v_cache, inp.slot_mapping.contiguous(), slots, mask, cfg.n_head, cfg.n_kv_head,
                           cfg.head_dim)  # fmt: skip
        x = x.index_select(0, inp.logits_rows)
        return self.head.kernel(x, torch.float32, norm_eps=self.final_eps, in_scale=self.final_norm)


class CachedAttention:
    """The attention step of the engine's LayerOps (model/layer_ops.py): this step's keys and values
    into layer i's cache, then every row's attention over its sequence (`attend`)."""

    def __init__(self, inp, k_cache: torch.Tensor, v_cache: torch.Tensor, dtype: torch.dtype) -> None:
        self.inp, self.k_cache, self.v_cache, self.dtype = inp, k_cache, v_cache, dtype

    def attend(self, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        kc, vc = self.k_cache[i], self.v_cache[i]
        slot_major = self.inp.slot_major
        if slot_major is None:
            pa.write_kv(kc, vc, self.inp.slot_mapping, k, v)
        else:
            npu_attention.write_kv(kc, vc, slot_major.slots, k, v, slot_major.block_size)
        return attend(self.inp, q, k, v, kc, vc).reshape(q.size(0), -1).to(self.dtype)


class PackedLayerOps(CachedAttention):
    """model/layer_ops.py's LayerOps over a PackedModel's fused products for one step: each norm is
    its per-row scale 1/rms(x) times the product (its weight is folded in), so q/k/v, rotary,
    attention and gate/up run in fp32; rotary turns q and k together (a roll with the sign in the
    sine table)."""

    def __init__(self, packed: PackedModel, inp, k_cache: torch.Tensor, v_cache: torch.Tensor, cos: torch.Tensor,
                 sin_signed: torch.Tensor, x: torch.Tensor) -> None:  # fmt: skip
        super().__init__(inp, k_cache, v_cache, x.dtype)
        cfg = packed.model.config
        self.layers, self.blocks = packed.layers, packed.model.model.layers
        self.H, self.H_kv, self.D = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        self.cos = cos.index_select(0, inp.positions)[:, None, :]  # [N, 1, D] fp32
        self.sin = sin_signed.index_select(0, inp.positions)[:, None, :]
        self.inv_c = 1.0 / x.size(1)

    def qkv(self, i: int, x: torch.Tensor) -> torch.Tensor:
        layer = self.layers[i]
        s = rms_scale(x, layer.eps_in, self.inv_c)
        qkv = layer.qkv(x)
        return qkv * s if layer.qkv_bias is None else torch.addcmul(layer.qkv_bias, qkv, s)  # fp32

    def qkv_input(self, i: int, x: torch.Tensor) -> torch.Tensor:
        s = rms_scale(x, self.layers[i].eps_in, self.inv_c)
        return (x * s * self.blocks[i].input_layernorm.weight).to(x.dtype)

    def rope(self, i: int, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        layer, H, H_kv, D = self.layers[i], self.H, self.H_kv, self.D
        N = qkv.size(0)
        if layer.q_norm is None:
            qk = qkv[:, : (H + H_kv) * D].view(N, H + H_kv, D)
        else:
            q = layer.q_norm(qkv[:, : H * D].reshape(N, H, D))
            k = layer.k_norm(qkv[:, H * D : (H + H_kv) * D].reshape(N, H_kv, D))
            qk = torch.cat([q, k], dim=1)
        qk = torch.addcmul(qk * self.cos, qk.roll(D // 2, dims=-1), self.sin)
        return qk[:, :H], qk[:, H:], qkv[:, (H + H_kv) * D :].view(N, H_kv, D)

    def o(self, i: int, y: torch.Tensor) -> torch.Tensor:
        return self.layers[i].o(y)

    def gate_up(self, i: int, x: torch.Tensor) -> torch.Tensor:
        layer = self.layers[i]
        return layer.gate_up(x) * rms_scale(x, layer.eps_post, self.inv_c)

    def gate_up_input(self, i: int, x: torch.Tensor) -> torch.Tensor:
        s = rms_scale(x, self.layers[i].eps_post, self.inv_c)
        return (x * s * self.blocks[i].post_attention_layernorm.weight).to(x.dtype)

    def swiglu(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return (F.silu(gate, inplace=True) * up).to(self.dtype)

    def down(self, i: int, act: torch.Tensor) -> torch.Tensor:
        return self.layers[i].down(act)


def rows_as_decode(inp) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Every row of the step as a decode row: (slots [N, L], mask [N, L] bool or None), the slots
    each row attends over (padded with slot 0, masked out). A prefill chunk's rows share its slots
    with a causal mask; a chunk that starts its sequence attends over its own new slots."""
    if not inp.prefills:
        mask = inp.decode_mask
        return inp.decode_slots.contiguous(), None if mask is None else mask.reshape(mask.size(0), -1).contiguous()
    slots, masks = [], []
    if inp.num_decode:
        slots.append(inp.decode_slots)
        d, length = inp.decode_slots.shape
        masks.append(inp.decode_mask.reshape(d, length) if inp.decode_mask is not None
                     else torch.ones(d, length, dtype=torch.bool))  # fmt: skip
    for c in inp.prefills:
        if c.slot_index is None:
            own = inp.slot_mapping[c.start : c.start + c.length]
            slots.append(own.expand(c.length, -1))
            masks.append(torch.ones(c.length, c.length, dtype=torch.bool).tril_())
        else:
            slots.append(c.slot_index.expand(c.length, -1))
            masks.append(c.mask)
    width = max(t.size(1) for t in slots)
    padded_slots = torch.zeros(len(inp.input_ids), width, dtype=torch.long)
    padded_mask = torch.zeros(len(inp.input_ids), width, dtype=torch.bool)
    row = 0
    for t, m in zip(slots, masks, strict=True):
        padded_slots[row : row + t.size(0), : t.size(1)] = t
        padded_mask[row : row + t.size(0), : t.size(1)] = m
        row += t.size(0)
    return padded_slots, padded_mask


def rms_scale(x: torch.Tensor, eps: torch.Tensor, inv_c: float) -> torch.Tensor:
    """1 / sqrt(mean(x^2) + eps) per row, fp32 [N, 1] (the norm's weight is in the next product)."""
    n = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float32)
    return torch.addcmul(eps, n, n, value=inv_c).rsqrt_()


def attend(inp, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kc: torch.Tensor,
           vc: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """Attention for every row of the flat batch: decode rows together, each prefill chunk alone."""
    outs = []
    d = inp.num_decode
    slot_major = inp.slot_major
    if d and slot_major is not None:  # Ascend's paged-attention kernel over the slot-major cache
        outs.append(npu_attention.decode_attention(q[:d], kc, vc, slot_major.block_size, slot_major.block_tables,
                                                   slot_major.context_lens, inp.decode_slots, inp.decode_mask))
    elif d:
        outs.append(pa.decode_attention(q[:d], kc, vc, inp.decode_slots, inp.decode_mask))
    for c in inp.prefills:
        rows = slice(c.start, c.start + c.length)
        outs.append(pa.prefill_attention(q[rows], k[rows], v[rows], kc, vc, c.slot_index, c.mask))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
