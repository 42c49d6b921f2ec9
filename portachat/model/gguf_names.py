"""llama.cpp's tensor names for our (Hugging Face) parameter names: one table, read both ways.

The GGUF reader (`model/gguf.py`) turns a file's tensor names into HF parameter names and the
writer (`export/gguf.py`) does the reverse; both derive from the tables here, so a name llama.cpp's
converter (convert_hf_to_gguf.py) knows is read and written alike.
"""

from __future__ import annotations

import re

# HF name after `model.layers.<i>.` -> llama.cpp's name after `blk.<i>.`.
LAYER_NAMES: dict[str, str] = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    **{
        f"self_attn.{hf}_proj.{kind}": f"attn_{gguf}.{kind}"
        for hf, gguf in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "output"))
        for kind in ("weight", "bias")
    },
    **{f"mlp.{part}_proj.{kind}": f"ffn_{part}.{kind}" for part in ("gate", "up", "down") for kind in ("weight", "bias")},
}
# Whole-model tensors, HF -> llama.cpp.
GLOBAL_NAMES: dict[str, str] = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}

_HF_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
_GGUF_LAYER = re.compile(r"blk\.(\d+)\.(.+)")
_HF_OF_LAYER = {gguf: hf for hf, gguf in LAYER_NAMES.items()}
_HF_OF_GLOBAL = {gguf: hf for hf, gguf in GLOBAL_NAMES.items()}


def gguf_name(hf_name: str) -> str | None:
    """llama.cpp's name for an HF parameter (`model.layers.3.self_attn.q_proj.weight` -> `blk.3.attn_q.weight`),
    or None for a parameter llama.cpp has no name for."""
    return _rename(hf_name, GLOBAL_NAMES, _HF_LAYER, LAYER_NAMES, "blk")


def hf_name(gguf_name: str) -> str | None:
    """The HF parameter name of a GGUF tensor (`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`),
    or None for a tensor this table does not know."""
    return _rename(gguf_name, _HF_OF_GLOBAL, _GGUF_LAYER, _HF_OF_LAYER, "model.layers")


def _rename(name: str, whole: dict[str, str], layer: re.Pattern[str], in_layer: dict[str, str], prefix: str) -> str | None:
    if name in whole:
        return whole[name]
    m = layer.fullmatch(name)
    if m and m.group(2) in in_layer:
        return f"{prefix}.{m.group(1)}.{in_layer[m.group(2)]}"
    return None
