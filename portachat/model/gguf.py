"""Read a `.gguf` file (llama.cpp's format) into the parts a Hugging Face model directory has.

`read_gguf(path)` returns, in memory, what `config.json`, `model.safetensors` (float32, HF parameter
names), `tokenizer.json`, `tokenizer_config.json` and `generation_config.json` would hold, so the
same loader builds our model from either. Quantized tensors are dequantized on load with the `gguf`
package; what llama.cpp's converter (convert_hf_to_gguf.py) changed on the way in is undone here:
tensor names, and the Q/K row order of the "llama" architecture.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from portachat.i18n import _
from portachat.model import gguf_names
from portachat.model.gguf_file import GGUFFile, GGUFFormatError
from portachat.model.gguf_tokenizer import GGUFTokenizerError, build_tokenizer, tokenizer_config
from portachat.model.hf import UnsupportedConfigError

# general.architecture -> the transformers class that loads the same weights.
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


class GGUFError(ValueError):
    """A file that is not a readable GGUF."""


class UnsupportedGGUFError(GGUFError, UnsupportedConfigError):
    """A readable GGUF this model cannot run: other architecture, tensor type or tokenizer."""


@dataclass
class GGUFParts:
    """What an HF model directory holds, read from one GGUF file."""

    config: dict[str, Any]
    state_dict: dict[str, torch.Tensor]
    tokenizer: Tokenizer
    tokenizer_config: dict[str, Any]
    generation_config: dict[str, Any]
    # the file's scalar metadata: general.name, general.file_type, ... (arrays like the vocabulary left out)
    metadata: dict[str, Any] = field(default_factory=dict)


def is_gguf(path: str | Path) -> bool:
    """Whether `path` is a file starting with GGUF's magic bytes."""
    path = Path(path)
    if not path.is_file():
        return False
    with path.open("rb") as f:
        return f.read(4) == b"GGUF"


def _open(path: str | Path) -> GGUFFile:
    path = Path(path)
    if not path.is_file():
        raise GGUFError(_("no GGUF file at {path}: pass the path of an existing .gguf file").format(path=path))
    try:
        return GGUFFile(path)
    except GGUFFormatError as e:
        raise GGUFError(_("{path} is not a readable GGUF file ({error}); re-download or re-convert it").format(
            path=path, error=e)) from e


def read_gguf_metadata(path: str | Path) -> dict[str, Any]:
    """All metadata key/values of a GGUF file (vocabulary included), without touching its tensors."""
    with _open(path) as f:
        return f.metadata


def _check_architecture(metadata: dict[str, Any], path: Path) -> str:
    arch = metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise UnsupportedGGUFError(_(
            "{file}: GGUF architecture {arch!r} is not supported; supported: {supported} (Llama and SmolLM2, "
            "Qwen2/Qwen2.5, Qwen3)").format(file=path.name, arch=arch, supported=", ".join(ARCHITECTURES)))
    return arch


def _single(value: Any, what: str) -> Any:
    """A per-model value that some files store per layer: accept it only when every layer agrees."""
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise UnsupportedGGUFError(_(
                "{what} differs between layers ({values}); only uniform layers are supported").format(
                what=what, values=sorted(set(value))))
        return value[0]
    return value


def _rope_scaling(
    metadata: dict[str, Any], arch: str, freq_factors: np.ndarray | None, head_dim: int, rope_theta: float
) -> dict[str, Any] | None:
    """HF's rope_scaling dict from llama.cpp's `rope.scaling.*` keys (or Llama 3's `rope_freqs` tensor)."""
    key = f"{arch}.rope.scaling."
    kind = metadata.get(key + "type", "none")
    if freq_factors is not None:
        if kind not in ("none", None):
            raise UnsupportedGGUFError(_(
                "rope scaling {kind!r} together with a rope_freqs tensor is not supported").format(kind=kind))
        return _llama3_rope_scaling(freq_factors, head_dim, rope_theta)
    if kind in ("none", None):
        return None
    factor = float(metadata.get(key + "factor", 1.0))
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    if kind == "yarn":
        out: dict[str, Any] = {"rope_type": "yarn", "factor": factor}
        if key + "original_context_length" in metadata:
            out["original_max_position_embeddings"] = int(metadata[key + "original_context_length"])
        for name in ("beta_fast", "beta_slow"):
            if key + "yarn_" + name in metadata:
                out[name] = float(metadata[key + "yarn_" + name])
        return out
    raise UnsupportedGGUFError(_(
        "rope scaling type {kind!r} is not supported; supported: none, linear, yarn, llama3").format(kind=kind))


def _llama3_factors(
    head_dim: int, theta: float, factor: float, low: float, high: float, original: int
) -> np.ndarray:
    """The per-frequency divisors convert_hf_to_gguf writes as `rope_freqs` for rope_type "llama3"."""
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def _llama3_rope_scaling(freq_factors: np.ndarray, head_dim: int, theta: float) -> dict[str, Any]:
    # The file keeps only the resulting factors; the parameters behind them are recovered by
    # recomputing candidates (Llama 3.1/3.2/3.3 use low=1, high=4, original=8192) until one matches.
    factor = float(freq_factors.max())
    for original in (8192, 4096, 2048, 16384, 32768, 131072):
        for low in (1.0, 2.0):
            for high in (4.0, 8.0, 2.0):
                candidate = _llama3_factors(head_dim, theta, factor, low, high, original)
                if candidate.shape == freq_factors.shape and np.allclose(
                    candidate, freq_factors, rtol=1e-4, atol=1e-5
                ):
                    return {
                        "rope_type": "llama3",
                        "factor": factor,
                        "low_freq_factor": low,
                        "high_freq_factor": high,
                        "original_max_position_embeddings": original,
                    }
    raise UnsupportedGGUFError(_(
        "this GGUF's rope_freqs tensor does not match Llama 3 rope scaling; it is not supported"))


def gguf_config(
    metadata: dict[str, Any], shapes: dict[str, tuple[int, ...]], freq_factors: np.ndarray | None = None
) -> dict[str, Any]:
    """The HF `config.json` dict for a GGUF with this metadata and these tensor shapes (torch order)."""
    arch = metadata["general.architecture"]

    def key(name: str, default: Any = None) -> Any:
        return metadata.get(f"{arch}.{name}", default)

    def need(name: str) -> Any:
        if metadata.get(f"{arch}.{name}") is None:
            raise GGUFError(_("the GGUF metadata lacks {key}; the file is incomplete, re-convert it").format(
                key=f"{arch}.{name}"))
        return metadata[f"{arch}.{name}"]

    hidden = int(need("embedding_length"))
    n_head = int(_single(need("attention.head_count"), "attention.head_count"))
    n_kv_head = int(_single(key("attention.head_count_kv", n_head), "attention.head_count_kv"))
    head_dim = int(key("attention.key_length", key("rope.dimension_count", hidden // n_head)))
    rotary_dim = int(key("rope.dimension_count", head_dim))
    if rotary_dim != head_dim:
        raise UnsupportedGGUFError(_(
            "partial rotary embedding ({rotary_dim} of {head_dim} dims) is not supported").format(
            rotary_dim=rotary_dim, head_dim=head_dim))
    if int(key("attention.value_length", head_dim)) != head_dim:
        raise UnsupportedGGUFError(_("different key and value head sizes are not supported"))
    n_layer = int(need("block_count"))
    rope_theta = float(key("rope.freq_base", 10000.0))
    vocab_size = shapes["token_embd.weight"][0]
    tied = "output.weight" not in shapes
    attention_bias = "blk.0.attn_q.bias" in shapes
    rope_scaling = _rope_scaling(metadata, arch, freq_factors, head_dim, rope_theta)
    rope_parameters = {"rope_type": "default", "rope_theta": rope_theta}
    if rope_scaling is not None:
        rope_parameters = {**rope_scaling, "rope_theta": rope_theta}

    def token_id(name: str) -> int | None:
        value = metadata.get(f"tokenizer.ggml.{name}")
        return None if value is None else int(value)

    config: dict[str, Any] = {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": int(_single(need("feed_forward_length"), "feed_forward_length")),
        "num_hidden_layers": n_layer,
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv_head,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": int(key("context_length", 2048)),
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": rope_theta,
        "rope_scaling": rope_scaling,
        "rope_parameters": rope_parameters,
        "tie_word_embeddings": tied,
        "attention_bias": attention_bias,
        "attention_dropout": 0.0,
        "bos_token_id": token_id("bos_token_id"),
        "eos_token_id": token_id("eos_token_id"),
        "pad_token_id": token_id("padding_token_id"),
        "torch_dtype": "float32",
        "dtype": "float32",
    }
    if arch == "llama":
        config["mlp_bias"] = "blk.0.ffn_up.bias" in shapes
    if arch == "qwen2" and not attention_bias:
        raise UnsupportedGGUFError(_("a qwen2 GGUF without q/k/v biases is not a Qwen2 model; not supported"))
    if arch in ("qwen2", "qwen3"):
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=n_layer)
    return config


def generation_config(metadata: dict[str, Any]) -> dict[str, Any]:
    """Which ids start, stop and pad: eos plus llama.cpp's end-of-turn ids when the file names them."""
    eos = [
        int(metadata[k])
        for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
        if metadata.get(k) is not None
    ]
    eos = list(dict.fromkeys(eos))
    out: dict[str, Any] = {"bos_token_id": metadata.get("tokenizer.ggml.bos_token_id")}
    out["eos_token_id"] = eos[0] if len(eos) == 1 else (eos or None)
    if metadata.get("tokenizer.ggml.padding_token_id") is not None:
        out["pad_token_id"] = int(metadata["tokenizer.ggml.padding_token_id"])
    return out


def hf_name(gguf_name: str) -> str:
    """HF parameter name of a GGUF tensor (`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`)."""
    name = gguf_names.hf_name(gguf_name)
    if name is None:
        raise UnsupportedGGUFError(_(
            "unexpected tensor {name!r} in the GGUF; this architecture's loader does not know it").format(name=gguf_name))
    return name


def unpermute_qk(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Undo convert_hf_to_gguf's LlamaModel.permute: llama.cpp's rotary pairs adjacent dimensions,
    HF's pairs the two halves of each head, so the converter interleaved each head's rows."""
    rows = weight.shape[0]
    half = rows // n_head // 2
    return weight.reshape(n_head, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _dequantizable_names() -> list[str]:
    """The types the installed gguf package dequantizes, for error messages (best effort: private table)."""
    import gguf.quants  # deferred: gguf files only

    traits = getattr(gguf.quants, "_type_traits", {})
    return sorted({"F32", "F16", *(t.name for t in traits)})


def _check_tensor_types(f: GGUFFile) -> None:
    """Fail before any work when a tensor type cannot be dequantized: one block of each type is tried."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType  # deferred: gguf files only
    from gguf.quants import dequantize  # deferred: gguf files only

    bad = []
    for ggml_type, info in {t.ggml_type: t for t in f.tensors.values()}.items():
        qtype = GGMLQuantizationType(ggml_type)
        block_bytes = GGML_QUANT_SIZES[qtype][1]
        try:
            dequantize(f.raw(info.name).reshape(-1)[:block_bytes], qtype)
        except NotImplementedError:
            bad.append(qtype.name)
    if bad:
        raise UnsupportedGGUFError(_(
            "{file} holds tensors of type {types}, which the installed gguf package cannot dequantize; supported: "
            "{supported}. Upgrade it (pip install -U gguf) or use a file with another quantization.").format(
            file=f.path.name, types=", ".join(sorted(bad)), supported=", ".join(_dequantizable_names())))


def _dequantize(f: GGUFFile, name: str) -> np.ndarray:
    from gguf.constants import GGMLQuantizationType  # deferred: gguf files only
    from gguf.quants import dequantize  # deferred: gguf files only

    info = f.tensors[name]
    values = dequantize(f.raw(name), GGMLQuantizationType(info.ggml_type))
    return np.array(values, dtype=np.float32).reshape(info.shape)  # a copy: nothing keeps the file mapped


def read_gguf(path: str | Path) -> GGUFParts:
    """Config, float32 state dict (HF names), tokenizer and its config, generation config of a GGUF file."""
    path = Path(path)
    with _open(path) as f:
        metadata = f.metadata
        arch = _check_architecture(metadata, path)
        if int(metadata.get("split.count", 1)) > 1:
            raise UnsupportedGGUFError(_(
                "{file} is part {part} of a GGUF split into {count} files; merge them first (llama-gguf-split "
                "--merge FIRST.gguf OUT.gguf)").format(
                file=path.name, part=int(metadata.get("split.no", 0)) + 1, count=metadata["split.count"]))
        _check_tensor_types(f)
        if "token_embd.weight" not in f.tensors:
            raise GGUFError(_("{file} has no token_embd.weight tensor; it is not a complete model").format(file=path.name))
        shapes = {name: info.shape for name, info in f.tensors.items()}
        freq_factors = _dequantize(f, "rope_freqs.weight") if "rope_freqs.weight" in shapes else None
        config = gguf_config(metadata, shapes, freq_factors)

        state_dict: dict[str, torch.Tensor] = {}
        for name in shapes:
            if name == "rope_freqs.weight":  # folded into config["rope_scaling"]
                continue
            weight = _dequantize(f, name)
            # Only "llama" files were permuted: llama.cpp runs qwen2/qwen3 with NeoX-style rotary.
            if arch == "llama" and re.fullmatch(r"blk\.\d+\.attn_q\.(weight|bias)", name):
                weight = unpermute_qk(weight, config["num_attention_heads"])
            elif arch == "llama" and re.fullmatch(r"blk\.\d+\.attn_k\.(weight|bias)", name):
                weight = unpermute_qk(weight, config["num_key_value_heads"])
            state_dict[hf_name(name)] = torch.from_numpy(np.ascontiguousarray(weight))

    try:
        tokenizer = build_tokenizer(metadata)
    except GGUFTokenizerError as e:
        raise UnsupportedGGUFError(_("{path}: {error}").format(path=path.name, error=e)) from e
    tok_config = tokenizer_config(metadata, tokenizer)
    tok_config["model_max_length"] = config["max_position_embeddings"]
    scalars = {k: v for k, v in metadata.items() if not isinstance(v, list)}
    return GGUFParts(
        config=config,
        state_dict=state_dict,
        tokenizer=tokenizer,
        tokenizer_config=tok_config,
        generation_config=generation_config(metadata),
        metadata=scalars,
    )
