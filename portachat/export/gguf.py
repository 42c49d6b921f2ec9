"""`portachat export gguf`: one GGUF file for llama.cpp (and anything that reads GGUF).

Written with the `gguf` package the way llama.cpp's convert_hf_to_gguf.py writes the same family:
its tensor names, the Llama q/k row permutation (llama.cpp rotates adjacent pairs; Qwen files are
not permuted, llama.cpp runs them NeoX-style), 1-D tensors kept f32, and the tokenizer as a "gpt2"
byte-level BPE with its pre-tokenizer *name* (llama.cpp keeps the split rules in its code, keyed by
that name). So the tokenizer must use a split pattern llama.cpp knows (ours is Qwen2's, "qwen2").
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from portachat.export.errors import ExportError
from portachat.export.source import check_output_free, load_exportable
from portachat.i18n import _
from portachat.model.gguf_names import gguf_name
from portachat.model.gpt import GPT
from portachat.storage.atomic import atomic_file
from portachat.tokenizer import Tokenizer
from portachat.tokenizer.template import CHAT_TEMPLATE

GGUF_TYPES = ("f32", "f16", "q8_0")
Q8_0_BLOCK = 32  # values per q8_0 block: a row length must be a multiple of it

# llama.cpp's token types (llama_token_type).
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_UNUSED = 1, 3, 5

@dataclass
class GGUFExport:
    path: Path
    type: str
    architecture: str
    pre_tokenizer: str
    bytes: int
    notes: list[str]


def gguf_tensor_name(hf_name: str) -> str:
    """llama.cpp's name for an HF parameter (`model.layers.3.self_attn.q_proj.weight` -> `blk.3.attn_q.weight`)."""
    name = gguf_name(hf_name)
    if name is None:
        raise ExportError(_("no GGUF name for parameter {name!r}: this model has a part llama.cpp does not know").format(
            name=hf_name))
    return name


def llama_permute(weight: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf's LlamaModel.permute: HF rotates the two halves of each head, llama.cpp
    adjacent pairs, so each head's q/k rows are interleaved."""
    rows = weight.shape[0]
    return (
        weight.reshape(n_head, 2, rows // n_head // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def tokenizer_arrays(tokenizer: Tokenizer, vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) as llama.cpp's "gpt2" tokenizer wants them, padded to the model's
    vocabulary with unused placeholder tokens (the embedding has more rows than the tokenizer has ids)."""
    state = json.loads(tokenizer._hf.to_str())
    vocab: dict[str, int] = state["model"]["vocab"]
    specials = set(tokenizer.special_ids.values())
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [TOKEN_UNUSED] * vocab_size
    for token, i in vocab.items():
        tokens[i], types[i] = token, TOKEN_NORMAL
    for added in state["added_tokens"]:
        tokens[added["id"]] = added["content"]
        types[added["id"]] = TOKEN_CONTROL if added["id"] in specials else TOKEN_NORMAL
    merges = [m if isinstance(m, str) else " ".join(m) for m in state["model"]["merges"]]
    return tokens, types, merges


def _tensor_data(name: str, tensor: torch.Tensor, type_: str, gguf) -> tuple[np.ndarray, object | None]:
    """(data, raw ggml type or None) for one tensor: 1-D stays f32 (as llama.cpp's converter does)."""
    data = tensor.detach().float().cpu().numpy()
    if data.ndim == 1 or type_ == "f32":
        return data, None
    if type_ == "f16" or data.shape[-1] % Q8_0_BLOCK:
        return data.astype(np.float16), None
    qtype = gguf.GGMLQuantizationType.Q8_0
    return gguf.quants.quantize(data, qtype), qtype


def export_gguf(model_path: str | Path, output: str | Path, type_: str = "f16") -> GGUFExport:
    """Write the checkpoint at `model_path` as one GGUF file at `output` (atomically)."""
    import gguf  # deferred: gguf files only

    if type_ not in GGUF_TYPES:
        raise ExportError(_("--type {type!r} is not valid for export gguf; valid values: {valid}").format(
            type=type_, valid=", ".join(GGUF_TYPES)))
    output = Path(output).expanduser()
    check_output_free(output)
    loaded = load_exportable(model_path)
    model: GPT = loaded.model
    tokenizer: Tokenizer = loaded.tokenizer
    cfg = model.config
    pre = tokenizer.pre_tokenizer_name()
    if pre is None:
        raise ExportError(_(
            "{path}: its tokenizer splits text with a pattern llama.cpp has no name for ({pattern!r}), so a GGUF "
            "runtime would tokenize differently. Export it with `portachat export hf` instead, or retrain the "
            "tokenizer (`portachat tokenizer train`: the default pattern is Qwen2's, which llama.cpp knows as "
            "'qwen2') and the model on it.").format(path=loaded.path, pattern=tokenizer.split_pattern()))
    if cfg.rope_scaling is not None:
        raise ExportError(_(
            "{path}: rope scaling {kind!r} is not written to GGUF by portachat yet; use `portachat export hf`").format(
            path=loaded.path, kind=cfg.rope_scaling.get("rope_type")))
    arch = cfg.architecture
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
             "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[type_]  # fmt: skip

    with atomic_file(output) as tmp:
        writer = gguf.GGUFWriter(str(tmp), arch)
        try:
            writer.add_name(loaded.path.name)
            writer.add_file_type(ftype)
            writer.add_context_length(cfg.max_seq_len)
            writer.add_embedding_length(cfg.n_embd)
            writer.add_block_count(cfg.n_layer)
            writer.add_feed_forward_length(cfg.intermediate_size)
            writer.add_head_count(cfg.n_head)
            writer.add_head_count_kv(cfg.n_kv_head)
            writer.add_key_length(cfg.head_dim)
            writer.add_value_length(cfg.head_dim)
            writer.add_rope_dimension_count(cfg.head_dim)
            writer.add_rope_freq_base(cfg.rope_theta)
            writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)

            tokens, types, merges = tokenizer_arrays(tokenizer, cfg.vocab_size)
            writer.add_tokenizer_model("gpt2")
            writer.add_tokenizer_pre(pre)
            writer.add_token_list(tokens)
            writer.add_token_types(types)
            writer.add_token_merges(merges)
            writer.add_bos_token_id(tokenizer.bos_id)
            # llama.cpp stops on the eos, eot and eom ids (its end-of-generation set). Ours are two:
            # <|assistant_end|> as eos (tokenizer_config.json's eos_token too) and <|bos|> in the eot slot.
            eos_id, eot_id = tokenizer.end_ids
            writer.add_eos_token_id(eos_id)
            writer.add_eot_token_id(eot_id)
            writer.add_pad_token_id(tokenizer.bos_id)  # portachat pads with bos (never a chat target)
            # Our models are trained on bos-led documents: llama.cpp prepends it to every prompt, and
            # its chat path drops the template's leading bos_token when it does, so chats get one.
            writer.add_add_bos_token(True)
            writer.add_add_eos_token(False)
            writer.add_chat_template(CHAT_TEMPLATE)

            state = model.state_dict()
            if cfg.tie_embeddings:
                state.pop("lm_head.weight", None)  # llama.cpp reuses token_embd when output.weight is absent
            for name, tensor in state.items():
                data, qtype = _tensor_data(name, tensor, type_, gguf)
                if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
                    heads = cfg.n_head if "q_proj" in name else cfg.n_kv_head
                    data = llama_permute(tensor.detach().float().numpy(), heads)
                    data, qtype = _tensor_data(name, torch.from_numpy(data), type_, gguf)
                if qtype is None:
                    writer.add_tensor(gguf_tensor_name(name), data)
                else:
                    writer.add_tensor(gguf_tensor_name(name), data, raw_dtype=qtype)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        except BaseException:
            with contextlib.suppress(Exception):
                writer.close()
            raise
        writer.close()
    notes = []
    if arch == "qwen3" and cfg.head_dim != 128:
        notes.append(
            f"head_dim is {cfg.head_dim}: llama.cpp reads it from {arch}.attention.key_length, but transformers' "
            "GGUF loader (5.x) ignores that key for qwen3 and assumes 128; load the `export hf` directory there"
        )
    return GGUFExport(
        path=output, type=type_, architecture=arch, pre_tokenizer=pre, bytes=output.stat().st_size, notes=notes
    )
