"""Mapping between GPTConfig and Hugging Face's Qwen3 `config.json` (transformers 4.56+ and 5.x).

The saved directory loads with `AutoModelForCausalLM.from_pretrained(dir)`, no remote code, and
in vLLM / llama.cpp converters that know Qwen3. Both spellings of version-dependent keys are
written (`rope_theta` and `rope_parameters`, `torch_dtype` and `dtype`) so old and new readers agree.
"""

from __future__ import annotations

from typing import Any

import torch

from portachat.model.config import GPTConfig

HF_ARCHITECTURE = "Qwen3ForCausalLM"
HF_MODEL_TYPE = "qwen3"


class UnsupportedConfigError(ValueError):
    """A Hugging Face config this model cannot represent (other architecture or option)."""


def exportable(cfg: GPTConfig) -> tuple[bool, str]:
    """Whether `cfg` maps onto Qwen3 exactly; the reason when it does not.

    Every GPTConfig option maps today; options added outside the HF mapping must report here.
    """
    return True, "maps onto Qwen3ForCausalLM"


def _dtype_name(dtype: str | torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in ("float32", "bfloat16", "float16"):
        raise UnsupportedConfigError(f"checkpoint dtype must be float32, bfloat16 or float16, got {dtype!r}")
    return name


def to_hf_config(
    cfg: GPTConfig,
    bos_id: int,
    eos_id: int | list[int],
    pad_id: int | None = None,
    dtype: str | torch.dtype = "float32",
) -> dict[str, Any]:
    """The `config.json` dict for a checkpoint of `cfg` whose weights are stored in `dtype`."""
    ok, reason = exportable(cfg)
    if not ok:
        raise UnsupportedConfigError(f"this model cannot be exported as {HF_ARCHITECTURE}: {reason}")
    dtype_name = _dtype_name(dtype)
    return {
        "architectures": [HF_ARCHITECTURE],
        "model_type": HF_MODEL_TYPE,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.n_kv_head,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len,
        "initializer_range": 0.02,
        "rms_norm_eps": cfg.rms_norm_eps,
        "use_cache": True,
        "tie_word_embeddings": cfg.tie_embeddings,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": cfg.n_layer,
        "layer_types": ["full_attention"] * cfg.n_layer,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "torch_dtype": dtype_name,
        "dtype": dtype_name,
        "transformers_version": "4.56.0",
    }


def _rope_theta(d: dict[str, Any]) -> float:
    params = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise UnsupportedConfigError(f"rope_parameters must be a dict, got {params!r}")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise UnsupportedConfigError(
            f"rope type {rope_type!r} (context extension) is not supported; only the default rotary embedding is"
        )
    extra = sorted(set(params) - {"rope_type", "type", "rope_theta"})
    if extra:
        raise UnsupportedConfigError(f"rope options {extra} are not supported")
    return float(params.get("rope_theta", d.get("rope_theta", 10000.0)))


def from_hf_config(d: dict[str, Any]) -> GPTConfig:
    """GPTConfig for a Hugging Face Qwen3 `config.json` dict; rejects anything we cannot run exactly."""
    model_type = d.get("model_type")
    architectures = d.get("architectures") or [HF_ARCHITECTURE]
    if model_type != HF_MODEL_TYPE or HF_ARCHITECTURE not in architectures:
        raise UnsupportedConfigError(
            f"only {HF_MODEL_TYPE} / {HF_ARCHITECTURE} checkpoints are supported, got model_type={model_type!r}, "
            f"architectures={architectures!r}"
        )
    if d.get("attention_bias", False):
        raise UnsupportedConfigError("attention_bias=true is not supported (this model has no biases)")
    if d.get("hidden_act", "silu") != "silu":
        raise UnsupportedConfigError(f"hidden_act={d['hidden_act']!r} is not supported; only silu is")
    if d.get("use_sliding_window", False):
        raise UnsupportedConfigError("sliding-window attention is not supported; only full attention is")
    layer_types = d.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types):
        raise UnsupportedConfigError(
            f"layer_types must all be 'full_attention', got {sorted(set(layer_types))}"
        )
    try:
        n_head = int(d["num_attention_heads"])
        n_embd = int(d["hidden_size"])
        return GPTConfig(
            vocab_size=int(d["vocab_size"]),
            n_layer=int(d["num_hidden_layers"]),
            n_embd=n_embd,
            n_head=n_head,
            n_kv_head=int(d.get("num_key_value_heads") or n_head),
            head_dim=int(d.get("head_dim") or n_embd // n_head),
            intermediate_size=int(d["intermediate_size"]),
            max_seq_len=int(d.get("max_position_embeddings", 2048)),
            rope_theta=_rope_theta(d),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(d.get("tie_word_embeddings", False)),
        )
    except KeyError as e:
        raise UnsupportedConfigError(f"config.json lacks the required field {e.args[0]!r}") from None


def generation_config(bos_id: int, eos_id: int | list[int], pad_id: int | None = None) -> dict[str, Any]:
    """The `generation_config.json` dict: which tokens start, stop and pad a sequence.

    Sampling settings are left to the caller (HF defaults to greedy decoding without them).
    """
    out: dict[str, Any] = {"bos_token_id": bos_id, "eos_token_id": eos_id, "transformers_version": "4.56.0"}
    if pad_id is not None:
        out["pad_token_id"] = pad_id
    return out
