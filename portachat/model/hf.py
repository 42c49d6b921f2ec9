"""Mapping between GPTConfig and Hugging Face `config.json` for the Qwen3, Qwen2 and Llama families
(transformers 4.56+ and 5.x).

A saved directory loads with `AutoModelForCausalLM.from_pretrained(dir)`, no remote code, and in
vLLM / llama.cpp converters that know the family. Both spellings of version-dependent keys are
written (`rope_theta` and `rope_parameters`, `rope_scaling` when scaled, `torch_dtype` and `dtype`)
so old and new readers agree. The families differ in two switches of our model:

    qwen3: QK-norm, no biases      qwen2: q/k/v biases, no QK-norm      llama: neither (SmolLM2)
"""

from __future__ import annotations

from typing import Any

import torch

from portachat.device.dtypes import DTYPES
from portachat.i18n import _
from portachat.model.config import ConfigError, GPTConfig, check_rope_scaling

# family -> (HF class, qk_norm, attention_bias): the only combinations transformers builds.
FAMILIES: dict[str, tuple[str, bool, bool]] = {
    "qwen3": ("Qwen3ForCausalLM", True, False),
    "qwen2": ("Qwen2ForCausalLM", False, True),
    "llama": ("LlamaForCausalLM", False, False),
}
SUPPORTED = "llama (SmolLM2 included), qwen2, qwen3"
# Options outside every HF family are saved under this model_type: transformers refuses it by name
# instead of loading wrong weights, and our loader reads the exact GPTConfig back.
OWN_MODEL_TYPE = "portachat"
TRANSFORMERS_VERSION = "4.56.0"

# Kept for callers that name the default family.
HF_ARCHITECTURE, HF_MODEL_TYPE = FAMILIES["qwen3"][0], "qwen3"


class UnsupportedConfigError(ValueError):
    """A Hugging Face config this model cannot represent (other architecture or option)."""


def exportable(cfg: GPTConfig) -> tuple[bool, str]:
    """Whether `cfg` maps exactly onto its `architecture`'s HF class; the reason when it does not."""
    hf_class, qk_norm, bias = FAMILIES[cfg.architecture]
    if (cfg.qk_norm, cfg.attention_bias) != (qk_norm, bias):
        return False, (
            _("qk_norm={qk_norm}, attention_bias={bias} does not match {hf_class} "
              "(qk_norm={want_qk_norm}, attention_bias={want_bias}); set architecture to the family that has these "
              "options (qwen3: QK-norm, no biases; qwen2: q/k/v biases; llama: neither)").format(
                qk_norm=cfg.qk_norm, bias=cfg.attention_bias, hf_class=hf_class, want_qk_norm=qk_norm, want_bias=bias)
        )
    return True, f"maps onto {hf_class}"


def _dtype_name(dtype: str | torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")  # HF's torch_dtype spelling
    if name not in {str(t).removeprefix("torch.") for t in DTYPES.values()}:
        raise UnsupportedConfigError(_("checkpoint dtype must be float32, bfloat16 or float16, got {dtype}").format(
            dtype=repr(dtype)))
    return name


def _rope_keys(cfg: GPTConfig) -> dict[str, Any]:
    if cfg.rope_scaling is None:
        return {"rope_theta": cfg.rope_theta, "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta}}
    return {
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {**cfg.rope_scaling, "rope_theta": cfg.rope_theta},
        "rope_scaling": dict(cfg.rope_scaling),  # transformers 4.x reads this key
    }


def to_hf_config(
    cfg: GPTConfig,
    bos_id: int | None,
    eos_id: int | list[int] | None,
    pad_id: int | None = None,
    dtype: str | torch.dtype = "float32",
) -> dict[str, Any]:
    """The `config.json` dict for a checkpoint of `cfg` whose weights are stored in `dtype`."""
    ok, reason = exportable(cfg)
    hf_class = FAMILIES[cfg.architecture][0]
    if not ok:
        raise UnsupportedConfigError(_("this model cannot be exported as {hf_class}: {reason}").format(
            hf_class=hf_class, reason=reason))
    dtype_name = _dtype_name(dtype)
    d: dict[str, Any] = {
        "architectures": [hf_class],
        "model_type": cfg.architecture,
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
        **_rope_keys(cfg),
        "attention_dropout": 0.0,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "torch_dtype": dtype_name,
        "dtype": dtype_name,
        "transformers_version": TRANSFORMERS_VERSION,
    }
    if cfg.architecture == "llama":
        d.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    else:  # the Qwen families carry sliding-window settings; we always attend to the full context
        if cfg.architecture == "qwen3":
            d["attention_bias"] = False
        d.update(
            use_sliding_window=False,
            sliding_window=None,
            max_window_layers=cfg.n_layer,
            layer_types=["full_attention"] * cfg.n_layer,
        )
    return d


def own_config_json(cfg: GPTConfig, bos_id: int | None, eos_id: int | list[int] | None) -> dict[str, Any]:
    """config.json for a model outside every HF family: exact, readable by us, refused by transformers."""
    return {
        "architectures": ["PortachatGPT"],
        "model_type": OWN_MODEL_TYPE,
        "portachat_config": cfg.to_dict(),
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
    }


def _rope(d: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from either spelling: `rope_parameters` (5.x) or `rope_scaling` (4.x)."""
    params = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise UnsupportedConfigError(_("rope_parameters must be a dict, got {value}").format(value=repr(params)))
    if "full_attention" in params and isinstance(params["full_attention"], dict):
        params = params["full_attention"]  # per-layer-type form; all our layers are full attention
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "linear", "llama3"):
        raise UnsupportedConfigError(
            _("rope type {type} (context extension) is not supported; supported: default, linear, llama3").format(
                type=repr(rope_type))
        )
    if float(params.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0)) or 1.0) != 1.0:
        raise UnsupportedConfigError(_("partial_rotary_factor other than 1.0 is not supported"))
    theta = float(params.get("rope_theta", d.get("rope_theta", 10000.0)))
    scaling_keys = ("rope_type", "type", "rope_theta", "partial_rotary_factor", "factor", "low_freq_factor",
                    "high_freq_factor", "original_max_position_embeddings")  # fmt: skip
    extra = sorted(set(params) - set(scaling_keys))
    if extra:
        raise UnsupportedConfigError(_("rope options {names} are not supported").format(names=extra))
    if rope_type == "default":
        return theta, None
    try:
        return theta, check_rope_scaling({**params, "rope_type": rope_type})
    except ConfigError as exc:
        raise UnsupportedConfigError(str(exc)) from None


def _check_family_options(d: dict[str, Any], family: str) -> None:
    if d.get("hidden_act", "silu") != "silu":
        raise UnsupportedConfigError(_("hidden_act={value} is not supported; only silu is").format(
            value=repr(d["hidden_act"])))
    if family == "llama":
        if d.get("mlp_bias", False):
            raise UnsupportedConfigError(_("mlp_bias=true is not supported (this model's MLP has no biases)"))
        if d.get("attention_bias", False):
            raise UnsupportedConfigError(
                _("attention_bias=true is not supported for llama (it also puts a bias on o_proj, which this model lacks)")
            )
        return
    if family == "qwen3" and d.get("attention_bias", False):
        raise UnsupportedConfigError(_("attention_bias=true is not supported for qwen3 (this model has no o_proj bias)"))
    if d.get("use_sliding_window", False):
        raise UnsupportedConfigError(_("sliding-window attention is not supported; only full attention is"))
    layer_types = d.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types):
        raise UnsupportedConfigError(_("layer_types must all be 'full_attention', got {value}").format(
            value=sorted(set(layer_types))))


def _sizes(d: dict[str, Any]) -> dict[str, Any]:
    """The GPTConfig fields that size the model, read from a decoder `config.json` dict (KeyError when
    one that has no default is missing)."""
    n_head = int(d["num_attention_heads"])
    n_embd = int(d["hidden_size"])
    return dict(
        vocab_size=int(d["vocab_size"]),
        n_layer=int(d["num_hidden_layers"]),
        n_embd=n_embd,
        n_head=n_head,
        n_kv_head=int(d.get("num_key_value_heads") or n_head),
        head_dim=int(d.get("head_dim") or n_embd // n_head),
        intermediate_size=int(d["intermediate_size"]),
        max_seq_len=int(d.get("max_position_embeddings") or 2048),
        rms_norm_eps=float(d.get("rms_norm_eps") or 1e-6),
        tie_embeddings=bool(d.get("tie_word_embeddings", False)),
    )


def sizes_config(d: dict[str, Any]) -> GPTConfig:
    """A GPTConfig with the sizes of any Llama / Qwen / Mistral style decoder config (the text part of a
    multimodal one), for the memory estimators: a family we cannot run still has sizes to count, so
    nothing but the sizes is checked. QK-norm as Qwen3 has it; q/k/v biases as the config (or Qwen2)
    says; the family is the nearest of ours with those options."""
    c = d.get("text_config", d)
    model_type = str(c.get("model_type", ""))
    qk_norm = model_type.startswith("qwen3")
    bias = bool(c.get("attention_bias", model_type == "qwen2"))
    try:
        return GPTConfig(**_sizes(c), qk_norm=qk_norm, attention_bias=bias,
                         architecture="qwen3" if qk_norm else "qwen2" if bias else "llama")
    except (KeyError, TypeError, ValueError) as e:
        raise UnsupportedConfigError(
            _("not a decoder config the estimator knows (missing or bad {error}); it needs hidden_size, "
              "num_hidden_layers, num_attention_heads, intermediate_size, vocab_size").format(error=e)) from e


def from_hf_config(d: dict[str, Any]) -> GPTConfig:
    """GPTConfig for a Hugging Face `config.json` dict of a supported family (or our own
    `portachat` model_type); rejects anything we cannot run exactly, naming what is supported."""
    model_type = d.get("model_type")
    architectures = d.get("architectures") or []
    if model_type == OWN_MODEL_TYPE:
        try:
            return GPTConfig.from_dict(d["portachat_config"])
        except (KeyError, TypeError) as exc:
            raise UnsupportedConfigError(_("a portachat config.json needs a 'portachat_config' dict ({error})").format(
                error=exc)) from None
    if model_type not in FAMILIES:
        raise UnsupportedConfigError(
            _("model_type={model_type} (architectures={architectures}) is not supported; "
              "supported families: {supported}").format(
                model_type=repr(model_type), architectures=repr(architectures), supported=SUPPORTED)
        )
    hf_class, qk_norm, bias = FAMILIES[model_type]
    if architectures and hf_class not in architectures:
        raise UnsupportedConfigError(
            _("architectures={architectures} is not supported for model_type {model_type}; only {hf_class} is").format(
                architectures=repr(architectures), model_type=repr(model_type), hf_class=hf_class)
        )
    _check_family_options(d, model_type)
    theta, scaling = _rope(d)
    try:
        return GPTConfig(**_sizes(d), rope_theta=theta, qk_norm=qk_norm, attention_bias=bias, rope_scaling=scaling,
                         architecture=model_type)
    except KeyError as e:
        raise UnsupportedConfigError(_("config.json lacks the required field {name}").format(name=repr(e.args[0]))) from None


def generation_config(
    bos_id: int | None, eos_id: int | list[int] | None, pad_id: int | None = None
) -> dict[str, Any]:
    """The `generation_config.json` dict: which tokens start, stop and pad a sequence.

    Sampling settings are left to the caller (HF defaults to greedy decoding without them).
    """
    out: dict[str, Any] = {"bos_token_id": bos_id, "eos_token_id": eos_id, "transformers_version": TRANSFORMERS_VERSION}
    if pad_id is not None:
        out["pad_token_id"] = pad_id
    return out
