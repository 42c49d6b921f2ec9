"""Model configuration: one dataclass, sized from a single `depth` knob.

The fields map one-to-one onto Hugging Face's Qwen3 configuration (see `hf.py`), so every model
we train can be saved as a plain `Qwen3ForCausalLM` checkpoint. A few options (no QK-norm,
q/k/v biases, rope scaling) cover the Llama (SmolLM2 included) and Qwen2 families, so the same
model class runs their checkpoints; `architecture` says which family a checkpoint saves as.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from portachat.i18n import _


class ConfigError(ValueError):
    """A model configuration that cannot be built (bad size, inconsistent heads, ...)."""


ARCHITECTURES = ("qwen3", "qwen2", "llama")
# Rope scaling types we compute exactly as transformers does (both keep attention scaling at 1).
ROPE_SCALING_TYPES = ("linear", "llama3")
# A decoder layer's linear projections by their HF module names (LoRA's default targets).
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def check_rope_scaling(rope_scaling: dict[str, Any] | None) -> dict[str, Any] | None:
    """Validate and normalise a rope scaling dict to {"rope_type", "factor", ...} (None = plain rope)."""
    if rope_scaling is None:
        return None
    if not isinstance(rope_scaling, dict):
        raise ConfigError(_("rope_scaling must be a dict or None, got {value}").format(value=repr(rope_scaling)))
    rope_type = rope_scaling.get("rope_type", rope_scaling.get("type"))
    if rope_type in (None, "default"):
        return None
    if rope_type not in ROPE_SCALING_TYPES:
        raise ConfigError(
            _("rope scaling type {type} is not supported; supported types are {supported} (or none)").format(
                type=repr(rope_type), supported=", ".join(ROPE_SCALING_TYPES))
        )
    keys = ("factor",) if rope_type == "linear" else _LLAMA3_KEYS
    missing = [k for k in keys if k not in rope_scaling]
    if missing:
        raise ConfigError(_("rope scaling {type} needs {missing}; got {value}").format(
            type=repr(rope_type), missing=missing, value=repr(rope_scaling)))
    out: dict[str, Any] = {"rope_type": rope_type}
    for k in keys:
        value = rope_scaling[k]
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ConfigError(_("rope scaling {key} must be a positive number, got {value}").format(
                key=k, value=repr(value)))
        out[k] = int(value) if k == "original_max_position_embeddings" else float(value)
    if rope_type == "llama3" and out["high_freq_factor"] <= out["low_freq_factor"]:
        raise ConfigError(_("llama3 rope scaling needs high_freq_factor > low_freq_factor, got {value}").format(
            value=repr(rope_scaling)))
    return out


def _round_up(x: int, multiple: int) -> int:
    return ((x + multiple - 1) // multiple) * multiple


@dataclass
class GPTConfig:
    vocab_size: int
    n_layer: int
    n_embd: int
    n_head: int
    n_kv_head: int
    head_dim: int
    intermediate_size: int
    max_seq_len: int = 2048
    # 10k is nanochat's and Llama-2's base: plenty for the 2k-8k contexts these models train on.
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_embeddings: bool = False
    # Family options (Qwen3 defaults). Qwen2: no QK-norm, q/k/v biases. Llama: neither.
    qk_norm: bool = True
    attention_bias: bool = False  # biases on q/k/v only (o_proj never has one, as in Qwen2)
    rope_scaling: dict[str, Any] | None = None  # {"rope_type": "linear"|"llama3", "factor": ...}
    architecture: str = "qwen3"  # the Hugging Face family config.json is written as

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "n_layer",
            "n_embd",
            "n_head",
            "n_kv_head",
            "head_dim",
            "intermediate_size",
            "max_seq_len",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(_("GPTConfig.{name} must be a positive integer, got {value}").format(
                    name=name, value=repr(value)))
        if self.n_head % self.n_kv_head != 0:
            raise ConfigError(
                _("n_head ({n_head}) must be a multiple of n_kv_head ({n_kv_head}) "
                  "for grouped-query attention; pick n_kv_head among the divisors of n_head").format(
                    n_head=self.n_head, n_kv_head=self.n_kv_head)
            )
        if self.head_dim % 2 != 0:
            raise ConfigError(_("head_dim must be even for rotary embeddings, got {value}").format(value=self.head_dim))
        if not (isinstance(self.rope_theta, int | float) and self.rope_theta > 0):
            raise ConfigError(_("rope_theta must be a positive number, got {value}").format(value=repr(self.rope_theta)))
        if not (isinstance(self.rms_norm_eps, int | float) and self.rms_norm_eps > 0):
            raise ConfigError(_("rms_norm_eps must be a positive number, got {value}").format(
                value=repr(self.rms_norm_eps)))
        self.rope_theta = float(self.rope_theta)
        self.rms_norm_eps = float(self.rms_norm_eps)
        self.tie_embeddings = bool(self.tie_embeddings)
        self.qk_norm = bool(self.qk_norm)
        self.attention_bias = bool(self.attention_bias)
        if self.architecture not in ARCHITECTURES:
            raise ConfigError(
                _("architecture must be one of {supported}, got {value}").format(
                    supported=", ".join(ARCHITECTURES), value=repr(self.architecture))
            )
        self.rope_scaling = check_rope_scaling(self.rope_scaling)

    @classmethod
    def from_depth(
        cls,
        depth: int,
        vocab_size: int,
        max_seq_len: int = 2048,
        aspect_ratio: int = 64,
        head_dim: int = 128,
        kv_head_ratio: int = 1,
        tie_embeddings: bool = False,
    ) -> GPTConfig:
        """nanochat's sizing: width = depth * aspect_ratio, heads of ~head_dim, gated MLP of ~8/3 width.

        The vocabulary is padded up to a multiple of 64 so the embedding and lm_head matmuls hit fast
        kernel shapes; the tokenizer's real vocabulary is smaller and the unused rows never get targets.
        """
        for name, value in (
            ("depth", depth),
            ("vocab_size", vocab_size),
            ("max_seq_len", max_seq_len),
            ("aspect_ratio", aspect_ratio),
            ("head_dim", head_dim),
            ("kv_head_ratio", kv_head_ratio),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(_("{name} must be a positive integer, got {value} (e.g. --depth 12)").format(
                    name=name, value=repr(value)))
        n_embd = depth * aspect_ratio
        if n_embd % 2 != 0:
            raise ConfigError(_("depth * aspect_ratio = {width} must be even (rotary needs even head dims)").format(
                width=n_embd))
        # Keep n_embd == n_head * head_dim: start from the requested head size and, for widths it does
        # not divide (tiny or odd depths), add heads until the split is exact with an even head size.
        n_head = max(1, n_embd // head_dim)
        while n_embd % n_head != 0 or (n_embd // n_head) % 2 != 0:
            n_head += 1
        head_dim = n_embd // n_head
        # Largest divisor of n_head not above n_head / kv_head_ratio (1 means plain multi-head attention).
        n_kv_head = max(1, n_head // kv_head_ratio)
        while n_head % n_kv_head != 0:
            n_kv_head -= 1
        # SwiGLU keeps the parameter count of a 4x MLP with 8/3 width; 64 keeps matmul shapes aligned.
        intermediate_size = _round_up(math.ceil(8 * n_embd / 3), 64)
        return cls(
            vocab_size=_round_up(vocab_size, 64),
            n_layer=depth,
            n_embd=n_embd,
            n_head=n_head,
            n_kv_head=n_kv_head,
            head_dim=head_dim,
            intermediate_size=intermediate_size,
            max_seq_len=max_seq_len,
            tie_embeddings=tie_embeddings,
        )

    def num_params(self, exclude_embedding: bool = False) -> int:
        """Parameter count by formula (equals `GPT(cfg).num_params()`; no model needs to be built).

        `exclude_embedding` drops the input embedding table. A tied table still counts once, as the
        output head, because it does matmul work there.
        """
        c, d = self.n_embd, self.head_dim
        attn = c * self.n_head * d * 2 + c * self.n_kv_head * d * 2
        attn += 2 * d if self.qk_norm else 0
        attn += (self.n_head + 2 * self.n_kv_head) * d if self.attention_bias else 0
        mlp = 3 * c * self.intermediate_size
        per_layer = attn + mlp + 2 * c
        table = self.vocab_size * c
        total = self.n_layer * per_layer + c + table + (0 if self.tie_embeddings else table)
        if exclude_embedding and not self.tie_embeddings:
            total -= table
        return total

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GPTConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(_("unknown GPTConfig fields {unknown}; known fields are {known}").format(
                unknown=unknown, known=sorted(known)))
        return cls(**d)


def training_tokens(cfg: GPTConfig, tokens_per_param: float = 20.0) -> int:
    """Chinchilla-style horizon (as nanochat): train on ~20 tokens per parameter."""
    if not tokens_per_param > 0:
        raise ConfigError(_("tokens_per_param must be positive, got {value}").format(value=repr(tokens_per_param)))
    return int(tokens_per_param * cfg.num_params())
