"""model/gguf_names.py: the one table the GGUF reader and the export writer both derive from."""

from __future__ import annotations

import pytest

from portachat.export.errors import ExportError
from portachat.export.gguf import gguf_tensor_name
from portachat.model.gguf import UnsupportedGGUFError
from portachat.model.gguf import hf_name as reader_hf_name
from portachat.model.gguf_names import GLOBAL_NAMES, LAYER_NAMES, gguf_name, hf_name


def _all_hf_names(layers: int = 2) -> list[str]:
    return [*GLOBAL_NAMES, *(f"model.layers.{i}.{rest}" for i in range(layers) for rest in LAYER_NAMES)]


def test_every_name_goes_there_and_back():
    names = _all_hf_names()
    ggufs = [gguf_name(n) for n in names]
    assert None not in ggufs and len(set(ggufs)) == len(names)  # one GGUF name per parameter
    assert [hf_name(g) for g in ggufs] == names


@pytest.mark.parametrize(("hf", "gguf"), [
    ("model.layers.3.self_attn.q_proj.weight", "blk.3.attn_q.weight"),
    ("model.layers.12.self_attn.o_proj.weight", "blk.12.attn_output.weight"),
    ("model.layers.0.self_attn.k_norm.weight", "blk.0.attn_k_norm.weight"),
    ("model.layers.1.post_attention_layernorm.weight", "blk.1.ffn_norm.weight"),
    ("model.layers.2.mlp.down_proj.weight", "blk.2.ffn_down.weight"),
    ("model.layers.2.self_attn.v_proj.bias", "blk.2.attn_v.bias"),
    ("model.embed_tokens.weight", "token_embd.weight"),
    ("lm_head.weight", "output.weight"),
])
def test_llama_cpp_names(hf, gguf):
    # convert_hf_to_gguf.py's names for the Llama / Qwen2 / Qwen3 tensors.
    assert gguf_name(hf) == gguf and hf_name(gguf) == hf


def test_reader_and_writer_use_the_table_and_refuse_what_it_lacks():
    for name in _all_hf_names(layers=1):
        assert reader_hf_name(gguf_tensor_name(name)) == name
    assert gguf_name("model.layers.0.mlp.experts.0.weight") is None and hf_name("blk.0.ffn_gate_exps.weight") is None
    with pytest.raises(ExportError, match="no GGUF name"):
        gguf_tensor_name("model.layers.0.mlp.experts.0.weight")
    with pytest.raises(UnsupportedGGUFError, match="unexpected tensor"):
        reader_hf_name("blk.0.ffn_gate_exps.weight")
    assert gguf_name("model.layers.x.mlp.up_proj.weight") is None  # a layer index is a number
