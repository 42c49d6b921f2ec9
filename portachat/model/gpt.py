"""The GPT: a decoder-only transformer laid out exactly like Hugging Face's Qwen3ForCausalLM.

RMSNorm (computed in fp32), rotary embeddings (rotate-half convention), QK-norm over the head
dimension before rotary, grouped-query attention, SiLU-gated MLP, no biases, tied or untied
embeddings. Module and parameter names match HF's, so `model.state_dict()` is a valid
`model.safetensors` and HF's logits equal ours. With `qk_norm=False` and optional q/k/v biases
the same modules are Llama's (SmolLM2) and Qwen2's, whose checkpoints load unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from portachat.model.config import GPTConfig
from portachat.model.layer_ops import decoder_layer
from portachat.model.loss import chunked_cross_entropy, loss_chunk_size
from portachat.ops import fast_ops
from portachat.ops.attention import AttentionMask, attention, packed_attention_mask


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # As HF: normalise in fp32, cast back, then scale, in x's dtype (ops/fast_ops.rms_norm_reference);
        # Ascend's fused kernel where it passed its self-test.
        return fast_ops.rms_norm(x, self.weight, self.eps)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rotary (ops/fast_ops.rotary: Ascend's fused kernel on [B, H, T, D] where it passed its
    self-test)."""
    return fast_ops.rotary(x, cos, sin)


def rope_inv_freq(
    head_dim: int, theta: float, rope_scaling: dict | None = None, device: torch.device | None = None
) -> torch.Tensor:
    """Rotary inverse frequencies [head_dim / 2] in fp32, as transformers computes them for the
    default rope and for the "linear" and "llama3" scalings (`_compute_llama3_parameters`)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float, device=device) / head_dim))
    if rope_scaling is None:
        return inv_freq
    factor = rope_scaling["factor"]
    if rope_scaling["rope_type"] == "linear":
        return inv_freq / factor
    # llama3: keep high frequencies, divide low ones by `factor`, interpolate smoothly in between.
    low, high = rope_scaling["low_freq_factor"], rope_scaling["high_freq_factor"]
    old_context = rope_scaling["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rotary_tables(
    head_dim: int,
    length: int,
    theta: float,
    device: torch.device | None = None,
    rope_scaling: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [length, head_dim] in fp32, computed exactly as HF's rope (default, linear, llama3)."""
    inv_freq = rope_inv_freq(head_dim, theta, rope_scaling, device)
    positions = torch.arange(length, dtype=torch.float, device=device)
    freqs = torch.outer(positions, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


class Attention(nn.Module):
    """q/k/v/o and QK-norm, HF's names. No forward of its own: Block.forward runs these modules through
    model/layer_ops.py's contract (hook the linears, not this container)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.n_embd, cfg.n_head * cfg.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.n_embd, cfg.n_kv_head * cfg.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.n_embd, cfg.n_kv_head * cfg.head_dim, bias=bias)
        self.o_proj = nn.Linear(cfg.n_head * cfg.head_dim, cfg.n_embd, bias=False)
        # Identity (no parameters, no work) for the families without QK-norm (Llama, Qwen2).
        self.q_norm: nn.Module = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else nn.Identity()
        self.k_norm: nn.Module = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else nn.Identity()


class MLP(nn.Module):
    """The gated MLP's products; like Attention, run by Block.forward through the layer contract."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.n_embd, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.n_embd, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.n_embd, bias=False)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.n_embd, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.n_embd, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attn_mask: AttentionMask | None = None) -> torch.Tensor:
        """x [B, T, C] -> the same after this layer (model/layer_ops.py's contract), causal attention
        within each row, or within each sequence of a packed row (`attn_mask`)."""
        return decoder_layer(SequenceOps((self,), cos, sin, attn_mask), 0, x)


class ModuleOps:
    """The steps of model/layer_ops.py's contract that are one of a Block's own modules, for layer i
    of `blocks`; subclasses lay out the heads and attend (SequenceOps here for training, the engine's
    ModuleLayerOps over its KV cache)."""

    def __init__(self, blocks: Sequence[Block]) -> None:
        self.blocks = blocks

    def qkv(self, i: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        attn = self.blocks[i].self_attn
        h = self.blocks[i].input_layernorm(x)
        return attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)

    def qkv_input(self, i: int, x: torch.Tensor) -> torch.Tensor:
        return self.blocks[i].input_layernorm(x)

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
        return fast_ops.swiglu(gate, up)

    def down(self, i: int, act: torch.Tensor) -> torch.Tensor:
        return self.blocks[i].mlp.down_proj(act)


class SequenceOps(ModuleOps):
    """Whole sequences, as training runs them: x [B, T, C], heads as [B, H, T, D], attention over the
    sequence itself (ops/attention.py: causal, or `attn_mask` for packed rows)."""

    def __init__(self, blocks: Sequence[Block], cos: torch.Tensor, sin: torch.Tensor,
                 attn_mask: AttentionMask | None) -> None:  # fmt: skip
        super().__init__(blocks)
        self.cos, self.sin, self.attn_mask = cos, sin, attn_mask

    def rope(self, i: int, qkv: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        attn = self.blocks[i].self_attn
        q, k, v = qkv
        B, T, _ = q.shape
        q = attn.q_norm(q.view(B, T, attn.n_head, attn.head_dim)).transpose(1, 2)
        k = attn.k_norm(k.view(B, T, attn.n_kv_head, attn.head_dim)).transpose(1, 2)
        v = v.view(B, T, attn.n_kv_head, attn.head_dim).transpose(1, 2)
        return apply_rotary(q, self.cos, self.sin), apply_rotary(k, self.cos, self.sin), v

    def attend(self, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        y = attention(q, k, v, is_causal=self.attn_mask is None, attn_mask=self.attn_mask)
        B, H, T, D = y.shape
        return y.transpose(1, 2).reshape(B, T, H * D)


class Transformer(nn.Module):
    """HF's `model.` prefix: embeddings, layers, final norm."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.n_embd, cfg.rms_norm_eps)


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Transformer(cfg)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # Rotary tables are derived data: non-persistent so they stay out of the checkpoint, fp32 so
        # positions keep full precision; they grow on demand for inference past max_seq_len.
        cos, sin = rotary_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta, rope_scaling=cfg.rope_scaling)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.init_weights()

    # ----------------------------------------------------------------------------- initialisation

    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> None:
        """nanochat-style init, chosen so that a fresh model trains fast and stably:

        - matrices read by the residual stream: uniform with std 1/sqrt(fan_in), so activations keep
          unit scale regardless of width (uniform avoids normal's rare large outliers);
        - o_proj and down_proj zero: every block starts as the identity and the residual stream is
          the embedding alone, which makes deep models as easy to start as shallow ones;
        - untied embeddings std 1 (the first RMSNorm rescales anyway) and lm_head std 0.001, so the
          first loss is ln(vocab) and no token is favoured;
        - tied embeddings std 0.02 (GPT-2): small enough as the output head, far above the norm eps;
        - all norm weights 1.
        Also rebuilds the rotary tables, so a model created on the meta device can be materialised
        with `to_empty()` and then `init_weights()`.
        """
        generator = None
        if seed is not None:
            generator = torch.Generator(device=self.model.embed_tokens.weight.device).manual_seed(seed)
        cfg = self.config
        if cfg.tie_embeddings:  # re-tie: materialising from the meta device may have split them
            self.lm_head.weight = self.model.embed_tokens.weight
        for block in self.model.layers:
            for linear in (
                block.self_attn.q_proj,
                block.self_attn.k_proj,
                block.self_attn.v_proj,
                block.mlp.gate_proj,
                block.mlp.up_proj,
            ):
                bound = math.sqrt(3.0 / linear.in_features)
                linear.weight.uniform_(-bound, bound, generator=generator)
                if linear.bias is not None:
                    linear.bias.zero_()
            block.self_attn.o_proj.weight.zero_()
            block.mlp.down_proj.weight.zero_()
        for module in self.modules():
            if isinstance(module, RMSNorm):
                module.weight.fill_(1.0)
        if cfg.tie_embeddings:
            self.model.embed_tokens.weight.normal_(0.0, 0.02, generator=generator)
        else:
            self.model.embed_tokens.weight.normal_(0.0, 1.0, generator=generator)
            self.lm_head.weight.normal_(0.0, 0.001, generator=generator)
        self._set_rotary(cfg.max_seq_len, self.rope_cos.device)

    def _set_rotary(self, length: int, device: torch.device) -> None:
        # Tables grown during generation (inference mode) must stay usable by training afterwards.
        cfg = self.config
        with torch.inference_mode(False), torch.no_grad():
            cos, sin = rotary_tables(cfg.head_dim, length, cfg.rope_theta, device, cfg.rope_scaling)
        self.rope_cos, self.rope_sin = cos, sin

    def rotary(self, length: int, device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [length, head_dim] in fp32 for positions 0..length-1 (rope scaling included), on
        `device` (default: the model's). For callers that apply rotary themselves (the engine)."""
        cos, sin = self._rotary(length)
        cos, sin = cos[:length], sin[:length]
        if device is not None:
            cos, sin = cos.to(device), sin.to(device)
        return cos, sin

    def _rotary(self, needed: int) -> tuple[torch.Tensor, torch.Tensor]:
        # `model.to(bfloat16)` also casts buffers: rebuild in fp32 rather than rotate with rounded angles.
        have = self.rope_cos.size(0)
        if have < needed:  # grow geometrically so a long decode rebuilds the tables only a few times
            self._set_rotary(max(needed, 2 * have), self.rope_cos.device)
        elif self.rope_cos.dtype != torch.float32:
            self._set_rotary(have, self.rope_cos.device)
        return self.rope_cos, self.rope_sin

    # ----------------------------------------------------------------------------- forward

    def hidden_states(self, idx: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """The final norm's output [B, T, C] for token ids [B, T] (causal): what the output head reads,
        and what decoder embeddings pool.

        `positions` [B, T]: each token's position within its own sequence, for rows that pack several
        sequences back to back (positions restart where one begins): rotary uses them, and attention
        stays inside each sequence (the mask in the form the device layer chose: ops/attention.py's
        packed_attention_mask). None = one sequence per row."""
        T = idx.size(1)
        cos, sin = self._rotary(T)
        mask = None
        if positions is None:
            cos, sin = cos[None, None, :T], sin[None, None, :T]
        else:  # a position never exceeds its index, so the tables for T cover them
            cos, sin = cos[positions][:, None], sin[positions][:, None]
            mask = packed_attention_mask(positions)
        x = self.model.embed_tokens(idx)
        # Rotate q and k in the dtype they are computed in (autocast's, else the weights'), so all of
        # q, k, v reach attention in one dtype.
        device_type = x.device.type
        compute = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else x.dtype
        cos, sin = cos.to(compute), sin.to(compute)
        for block in self.model.layers:
            x = block(x, cos, sin) if mask is None else block(x, cos, sin, attn_mask=mask)
        return self.model.norm(x)

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        loss_reduction: str = "mean",
        *,
        weights: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        supervised: torch.Tensor | None = None,
        hidden_only: bool = False,
    ) -> torch.Tensor:
        """Logits [B, T, V] in fp32, or the fp32 cross-entropy loss: causal attention over `idx`
        (inference with a KV cache is the engine's: portachat.engine).

        Targets equal to -1 are ignored; `loss_reduction` is "mean", "sum" or "none" ([B, T]). The loss
        computes logits only at supervised positions, a chunk at a time (portachat.model.loss);
        `weights` [B, T] multiply each token's loss. `positions`: see hidden_states (packed rows).
        `supervised`: the flat indices of targets >= 0 when the caller has them (no device sync to find them).
        `hidden_only`: return hidden_states [B, T, C] instead (distillation runs the head itself, a chunk at a
        time), through forward so that DDP's hooks see the call.
        """
        if idx.dim() != 2:
            raise ValueError(f"idx must be a [batch, time] tensor of token ids, got shape {tuple(idx.shape)}")
        if loss_reduction not in ("mean", "sum", "none"):
            raise ValueError(f"loss_reduction must be 'mean', 'sum' or 'none', got {loss_reduction!r}")
        hidden = self.hidden_states(idx, positions)
        if hidden_only:
            return hidden
        if targets is None:
            return self.lm_head(hidden).float()
        return chunked_cross_entropy(hidden, self.lm_head, targets, weights=weights, reduction=loss_reduction,
                                     chunk=loss_chunk_size(self.config.vocab_size), keep=supervised)

    # ----------------------------------------------------------------------------- accounting

    def num_params(self, exclude_embedding: bool = False) -> int:
        """Unique parameters (a tied table counts once). `exclude_embedding` drops the input table
        unless it is tied, since then it also does the output head's matmul work."""
        total = sum(p.numel() for p in self.parameters())
        if exclude_embedding and not self.config.tie_embeddings:
            total -= self.model.embed_tokens.weight.numel()
        return total

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward), as nanochat: 6 per matmul parameter plus
        attention's 12 * layers * heads * head_dim * seq_len (QK^T and AV, forward and backward)."""
        cfg = self.config
        return (
            6.0 * self.num_params(exclude_embedding=True)
            + 12.0 * cfg.n_layer * cfg.n_head * cfg.head_dim * seq_len
        )

    def training_flop_rates(self) -> tuple[float, float]:
        """FLOPs of the weights' matmuls in a training step, as (per real token, per supervised token):
        forward 2 per weight, backward 2 more for the input's gradient and 2 for a weight that trains
        (a frozen one, as under LoRA, needs none); the output head only at supervised positions (the
        loss computes nothing else). With every weight training and every position supervised their sum
        is flops_per_token without attention."""
        cfg = self.config
        head = self.model.embed_tokens.weight if cfg.tie_embeddings else self.lm_head.weight
        skip = {id(self.model.embed_tokens.weight), id(head)}
        body = trains = 0
        for p in self.parameters():
            if id(p) not in skip:
                body += p.numel()
                trains += p.numel() if p.requires_grad else 0
        head_params = cfg.vocab_size * cfg.n_embd
        return 4.0 * body + 2.0 * trains, (4.0 + 2.0 * head.requires_grad) * head_params

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """Parameters split by how optimizers treat them. "matrix": 2-D weights inside the layers
        (Muon); "embedding": the token table; "lm_head": the output head (empty when tied: the shared
        table is in "embedding"); "scalar": 1-D norm weights. Every parameter is in exactly one group."""
        groups: dict[str, list[nn.Parameter]] = {"matrix": [], "embedding": [], "lm_head": [], "scalar": []}
        groups["embedding"].append(self.model.embed_tokens.weight)
        if not self.config.tie_embeddings:
            groups["lm_head"].append(self.lm_head.weight)
        for p in self.model.layers.parameters():
            groups["matrix" if p.dim() == 2 else "scalar"].append(p)
        groups["scalar"].append(self.model.norm.weight)
        return groups
