"""GGUF reading on small files written here with gguf.GGUFWriter, the way llama.cpp's converter writes them."""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from portachat.model.gguf import (
    GGUFError,
    UnsupportedGGUFError,
    is_gguf,
    read_gguf,
    read_gguf_metadata,
)
from portachat.model.hf import UnsupportedConfigError

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's what they'll say, and we're sure.",
    "def add(a, b):\n    return a + b  # adds two numbers\n",
    "In 2024 there were 365 days; 3.14159 is pi and 1000000 is a million.",
    "Hello, world! Hello again, world. Goodbye, cruel world.",
    "   indented text\twith tabs\n\nand blank lines   ",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
)
STRINGS = [
    "Hello, world!",
    "The lazy dog's fox.",
    "def f(x):\n    return x  # comment\n",
    "我爱北京",
    "emoji 😀 ✨",
    "1 2  3   4 and 2024-11-22",
    "tabs\tand\n\nnewlines   ",
    "<|im_start|>user\nhi<|im_end|>\n",
    "",
]


def train_byte_bpe(vocab_size: int = 320) -> Tokenizer:
    """A real byte-level BPE (GPT-2 pre-tokenizer), trained on a few lines with the tokenizers library."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    return tok


@pytest.fixture(scope="module")
def bpe() -> Tokenizer:
    return train_byte_bpe()


def _tokenizer_arrays(tok: Tokenizer) -> tuple[list[str], list[int], list[str]]:
    import json

    model = json.loads(tok.to_str())["model"]
    vocab = tok.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    types = [3 if t in SPECIALS else 1 for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, types, merges


def tiny_hf_config(arch: str, vocab_size: int, tied: bool = True) -> dict:
    head_dim = 32 if arch == "qwen3" else 16  # qwen3: head_dim != hidden / heads, as in real Qwen3
    return {
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": head_dim,
        "rope_theta": 50000.0,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 256,
        "tie_word_embeddings": tied,
        "attention_bias": arch == "qwen2",
    }


def random_hf_state(arch: str, cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights under HF parameter names (what a Llama/Qwen2/Qwen3 safetensors file holds)."""
    g = torch.Generator().manual_seed(seed)
    h, f, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    nq, nkv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.1

    sd = {"model.embed_tokens.weight": rnd(cfg["vocab_size"], h), "model.norm.weight": 1 + rnd(h)}
    if not cfg["tie_word_embeddings"]:
        sd["lm_head.weight"] = rnd(cfg["vocab_size"], h)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        sd |= {
            p + "input_layernorm.weight": 1 + rnd(h),
            p + "post_attention_layernorm.weight": 1 + rnd(h),
            p + "self_attn.q_proj.weight": rnd(nq, h),
            p + "self_attn.k_proj.weight": rnd(nkv, h),
            p + "self_attn.v_proj.weight": rnd(nkv, h),
            p + "self_attn.o_proj.weight": rnd(h, nq),
            p + "mlp.gate_proj.weight": rnd(f, h),
            p + "mlp.up_proj.weight": rnd(f, h),
            p + "mlp.down_proj.weight": rnd(h, f),
        }
        if arch == "qwen2":
            sd |= {p + "self_attn.q_proj.bias": rnd(nq), p + "self_attn.k_proj.bias": rnd(nkv)}
            sd |= {p + "self_attn.v_proj.bias": rnd(nkv)}
        if arch == "qwen3":
            sd |= {p + "self_attn.q_norm.weight": 1 + rnd(d), p + "self_attn.k_norm.weight": 1 + rnd(d)}
    return sd


GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_name(hf: str) -> str:
    if hf in GGUF_NAMES:
        return GGUF_NAMES[hf]
    _, _, layer, rest = hf.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{GGUF_NAMES[module]}.{kind}"


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf's LlamaModel.permute (HF rotary halves -> llama.cpp interleaved pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def stored(w: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """The float32 values a reader gets back for `w` written as `qtype` (vectors stay F32, as llama.cpp keeps them)."""
    if w.ndim == 1 or qtype == GGMLQuantizationType.F32:
        return w
    if qtype == GGMLQuantizationType.F16:
        return w.astype(np.float16).astype(np.float32)
    return gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype)


def write_gguf(
    path: Path,
    arch: str,
    cfg: dict,
    state: dict[str, torch.Tensor],
    tok: Tokenizer,
    qtype: GGMLQuantizationType = GGMLQuantizationType.F32,
    pre: str = "gpt-2",
    tokenizer_model: str = "gpt2",
    extra_tensors: dict[str, np.ndarray] | None = None,
    extra_metadata: dict[str, int] | None = None,
) -> Path:
    w = gguf.GGUFWriter(path, arch)
    w.add_name("tiny test model")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    if arch == "qwen3":
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    else:
        w.add_rope_dimension_count(cfg["head_dim"])
    tokens, types, merges = _tokenizer_arrays(tok)
    w.add_tokenizer_model(tokenizer_model)
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|im_start|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    for key, value in (extra_metadata or {}).items():
        w.add_uint16(key, value)
    for name, tensor in state.items():
        data = tensor.numpy().astype(np.float32)
        if arch == "llama" and ".q_proj." in name:
            data = llama_permute(data, cfg["num_attention_heads"])
        if arch == "llama" and ".k_proj." in name:
            data = llama_permute(data, cfg["num_key_value_heads"])
        if data.ndim == 1 or qtype == GGMLQuantizationType.F32:
            w.add_tensor(gguf_name(name), data)
        elif qtype == GGMLQuantizationType.F16:
            w.add_tensor(gguf_name(name), data.astype(np.float16))
        else:
            w.add_tensor(gguf_name(name), gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    for name, data in (extra_tensors or {}).items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


QTYPES = [GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.Q8_0]


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_reads_config_and_weights(tmp_path, bpe, arch, qtype):
    cfg = tiny_hf_config(arch, bpe.get_vocab_size(), tied=arch != "qwen2")
    state = random_hf_state(arch, cfg)
    path = write_gguf(tmp_path / f"{arch}.gguf", arch, cfg, state, bpe, qtype)

    parts = read_gguf(path)

    c = parts.config
    assert c["model_type"] == arch
    assert c["architectures"] == [
        {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[arch]
    ]
    for key in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
        "tie_word_embeddings",
        "attention_bias",
    ):
        assert c[key] == cfg[key], key
    assert c["rope_theta"] == cfg["rope_theta"]
    assert c["rms_norm_eps"] == pytest.approx(cfg["rms_norm_eps"], rel=1e-6)  # stored as float32
    assert c["rope_scaling"] is None
    assert c["rope_parameters"] == {"rope_type": "default", "rope_theta": cfg["rope_theta"]}
    assert (c["bos_token_id"], c["eos_token_id"]) == (
        bpe.token_to_id("<|im_start|>"),
        bpe.token_to_id("<|im_end|>"),
    )

    # Same names as the HF checkpoint (no lm_head when tied), values back in HF's row order.
    assert set(parts.state_dict) == set(state)
    for name, expected in state.items():
        got = parts.state_dict[name]
        assert got.dtype == torch.float32 and got.shape == expected.shape, name
        want = torch.from_numpy(stored(expected.numpy(), qtype))
        assert torch.equal(got, want), name
    if qtype == GGMLQuantizationType.Q8_0:  # and the quantized ones are still close to the originals
        q = parts.state_dict["model.layers.0.self_attn.q_proj.weight"]
        assert (q - state["model.layers.0.self_attn.q_proj.weight"]).abs().max() < 0.01

    assert parts.generation_config == {
        "bos_token_id": c["bos_token_id"],
        "eos_token_id": c["eos_token_id"],
        "pad_token_id": bpe.token_to_id("<|endoftext|>"),
    }
    assert parts.tokenizer_config["chat_template"] == CHAT_TEMPLATE
    assert parts.tokenizer_config["bos_token"] == "<|im_start|>"
    assert parts.tokenizer_config["eos_token"] == "<|im_end|>"
    assert parts.metadata["general.name"] == "tiny test model"


def test_llama_unpermute_is_the_inverse_of_the_converter():
    w = np.arange(6 * 4 * 3, dtype=np.float32).reshape(6 * 4, 3)  # 6 heads of dim 4
    from portachat.model.gguf import unpermute_qk

    assert np.array_equal(unpermute_qk(llama_permute(w, 6), 6), w)
    assert not np.array_equal(llama_permute(w, 6), w)


def test_tokenizer_matches_the_trained_one(tmp_path, bpe):
    cfg = tiny_hf_config("llama", bpe.get_vocab_size())
    path = write_gguf(tmp_path / "m.gguf", "llama", cfg, random_hf_state("llama", cfg), bpe)

    tok = read_gguf(path).tokenizer

    assert tok.get_vocab_size() == bpe.get_vocab_size()
    for s in STRINGS:
        assert tok.encode(s).ids == bpe.encode(s).ids, s
        assert tok.decode(tok.encode(s).ids, skip_special_tokens=False) == s
    # control tokens stay whole and are special (dropped by skip_special_tokens)
    ids = tok.encode("<|im_start|>user").ids
    assert ids[0] == bpe.token_to_id("<|im_start|>")
    assert tok.decode(ids) == "user"


def test_smollm_pre_tokenizer_splits_digits(tmp_path, bpe):
    """llama.cpp's "smollm" splits every digit before GPT-2's regex (SmolLM2's tokenizer.json: Digits + ByteLevel)."""
    cfg = tiny_hf_config("llama", bpe.get_vocab_size())
    path = write_gguf(tmp_path / "m.gguf", "llama", cfg, random_hf_state("llama", cfg), bpe, pre="smollm")
    tok = read_gguf(path).tokenizer
    pieces = tok.encode("x  42").tokens
    assert pieces[-2:] == ["4", "2"]
    assert "".join(pieces) == "xĠĠ42"


def test_unsupported_architecture_is_a_clear_error(tmp_path, bpe):
    cfg = tiny_hf_config("llama", bpe.get_vocab_size())
    path = write_gguf(tmp_path / "g.gguf", "gemma2", cfg, random_hf_state("llama", cfg), bpe)
    with pytest.raises(
        UnsupportedGGUFError, match=r"'gemma2' is not supported; supported: llama, qwen2, qwen3"
    ):
        read_gguf(path)
    with pytest.raises(UnsupportedConfigError):  # the same family as unsupported HF configs
        read_gguf(path)


def test_tensor_type_gguf_cannot_dequantize_is_a_clear_error(tmp_path, bpe):
    cfg = tiny_hf_config("llama", bpe.get_vocab_size())
    state = random_hf_state("llama", cfg)
    path = write_gguf(
        tmp_path / "f64.gguf",
        "llama",
        cfg,
        state,
        bpe,
        extra_tensors={"blk.0.extra.weight": np.zeros(4, dtype=np.float64)},
    )
    with pytest.raises(UnsupportedGGUFError, match=r"tensors of type F64.*supported: .*Q8_0"):
        read_gguf(path)


def test_sentencepiece_vocabulary_is_rejected(tmp_path, bpe):
    cfg = tiny_hf_config("llama", bpe.get_vocab_size())
    path = write_gguf(
        tmp_path / "spm.gguf", "llama", cfg, random_hf_state("llama", cfg), bpe, tokenizer_model="llama"
    )
    with pytest.raises(UnsupportedGGUFError, match=r"only byte-level BPE"):
        read_gguf(path)


def test_unknown_pre_tokenizer_is_rejected(tmp_path, bpe):
    cfg = tiny_hf_config("llama", bpe.get_vocab_size())
    path = write_gguf(tmp_path / "p.gguf", "llama", cfg, random_hf_state("llama", cfg), bpe, pre="martian")
    with pytest.raises(UnsupportedGGUFError, match=r"'martian'.*supported: .*smollm"):
        read_gguf(path)


def test_not_a_gguf_file(tmp_path):
    junk = tmp_path / "model.gguf"
    junk.write_bytes(b"not a gguf at all" * 10)
    assert not is_gguf(junk)
    with pytest.raises(GGUFError, match="not a readable GGUF"):
        read_gguf(junk)
    with pytest.raises(GGUFError, match="no GGUF file at"):
        read_gguf(tmp_path / "missing.gguf")


def test_llama3_rope_freqs_become_rope_scaling(tmp_path, bpe):
    """Llama 3.x files carry rope scaling only as a rope_freqs tensor; the parameters are recovered from it."""
    from portachat.model.gguf import _llama3_factors

    cfg = tiny_hf_config("llama", bpe.get_vocab_size())
    cfg["head_dim"] = 64
    cfg["num_attention_heads"], cfg["num_key_value_heads"] = 1, 1
    cfg["rope_theta"] = 500000.0
    factors = _llama3_factors(64, 500000.0, factor=8.0, low=1.0, high=4.0, original=8192)
    assert 1.0 < factors[len(factors) // 2] < 8.0 or factors.max() == 8.0
    path = write_gguf(
        tmp_path / "l3.gguf",
        "llama",
        cfg,
        random_hf_state("llama", cfg),
        bpe,
        extra_tensors={"rope_freqs.weight": factors},
    )
    parts = read_gguf(path)
    assert parts.config["rope_scaling"] == {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    assert parts.config["rope_parameters"]["rope_type"] == "llama3"
    assert "rope_freqs.weight" not in parts.state_dict and not any("rope" in k for k in parts.state_dict)


def test_metadata_reads_without_tensors(tmp_path, bpe):
    cfg = tiny_hf_config("qwen3", bpe.get_vocab_size())
    path = write_gguf(tmp_path / "q.gguf", "qwen3", cfg, random_hf_state("qwen3", cfg), bpe)
    meta = read_gguf_metadata(path)
    assert meta["general.architecture"] == "qwen3"
    assert meta["qwen3.attention.key_length"] == 32
    assert len(meta["tokenizer.ggml.tokens"]) == bpe.get_vocab_size()
    assert is_gguf(path)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_transformers_runs_what_we_read(tmp_path, bpe, arch):
    """The config and weights we read, given to transformers, reproduce the original model's logits:
    names, Q/K order, biases, head_dim, rope theta, eps and tying all land where HF expects them."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = tiny_hf_config(arch, bpe.get_vocab_size(), tied=arch != "qwen2")
    hf_cfg = transformers.AutoConfig.for_model(
        arch,
        **{k: v for k, v in cfg.items() if k != "rope_theta"},
        rope_parameters={"rope_type": "default", "rope_theta": cfg["rope_theta"]},
    )
    original = transformers.AutoModelForCausalLM.from_config(hf_cfg).eval()
    with torch.no_grad():
        for p in original.parameters():
            p.normal_(0, 0.1)
    state = {
        k: v
        for k, v in original.state_dict().items()
        if not (cfg["tie_word_embeddings"] and k == "lm_head.weight")
    }
    path = write_gguf(tmp_path / f"{arch}.gguf", arch, cfg, state, bpe)

    parts = read_gguf(path)
    rebuilt_cfg = transformers.AutoConfig.for_model(**parts.config)
    rebuilt = transformers.AutoModelForCausalLM.from_config(rebuilt_cfg).eval()
    missing, unexpected = rebuilt.load_state_dict(parts.state_dict, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    if rebuilt_cfg.tie_word_embeddings:
        rebuilt.tie_weights()

    ids = torch.tensor([bpe.encode("Hello, world! def f(x): return 42").ids])
    with torch.no_grad():
        want, got = original(ids).logits, rebuilt(ids).logits
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    assert not math.isnan(got.abs().max().item())

    # and portachat's own model, built from the same parts by the loader every source goes through
    from portachat.model.load import build_from_parts

    ours, tokenizer, _ = build_from_parts(parts, device="cpu", dtype=torch.float32, where=str(path))
    with torch.no_grad():
        assert torch.allclose(ours(ids).float(), want, atol=1e-5)
    assert (
        tokenizer.render_prompt([{"role": "user", "content": "hi"}])
        == bpe.encode("<|im_start|>user\nhi<|im_end|>\n").ids
    )


def _metadata(tok: Tokenizer, pre: str, extra_tokens: tuple[str, ...] = (), **flags: object) -> dict:
    tokens, types, merges = _tokenizer_arrays(tok)
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens + list(extra_tokens),
        "tokenizer.ggml.token_type": types + [1] * len(extra_tokens),
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": tokens.index("<|im_start|>"),
        "tokenizer.ggml.eos_token_id": tokens.index("<|im_end|>"),
    }
    return meta | {f"tokenizer.ggml.{k}": v for k, v in flags.items()}


def test_llama3_group_adds_bos_by_default_and_ignores_merges(bpe):
    """llama.cpp's Llama 3 rules: BOS unless the file says otherwise; a word in the vocabulary is one token."""
    from portachat.model.gguf_tokenizer import build_tokenizer, tokenizer_config

    bos = bpe.token_to_id("<|im_start|>")
    meta = _metadata(bpe, "llama-bpe", extra_tokens=("Ġlazydog",))
    llama3 = build_tokenizer(meta)
    assert llama3.encode("Hi").ids[0] == bos
    assert llama3.encode(" lazydog", add_special_tokens=False).tokens == ["Ġlazydog"]
    assert tokenizer_config(meta, llama3)["add_bos_token"] is True

    gpt2 = build_tokenizer(_metadata(bpe, "gpt-2", extra_tokens=("Ġlazydog",)))
    assert gpt2.encode("Hi").ids[0] != bos
    assert len(gpt2.encode(" lazydog").tokens) > 1  # merges decide: the added word is unreachable

    no_bos = build_tokenizer(_metadata(bpe, "llama-bpe", add_bos_token=False))
    assert no_bos.encode("Hi").ids == bpe.encode("Hi").ids


def test_split_gguf_is_refused_with_the_merge_command(tmp_path, bpe):
    cfg = tiny_hf_config("llama", bpe.get_vocab_size())
    path = write_gguf(tmp_path / "m-00001-of-00002.gguf", "llama", cfg, random_hf_state("llama", cfg), bpe,
                      extra_metadata={"split.count": 2, "split.no": 0})  # fmt: skip
    with pytest.raises(
        UnsupportedGGUFError, match=r"part 1 of a GGUF split into 2 files.*llama-gguf-split --merge"
    ):
        read_gguf(path)
