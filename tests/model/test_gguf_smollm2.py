"""The real test model, SmolLM2-135M-Instruct (Q4_1 GGUF), read by us and by transformers' GGUF loader."""

from __future__ import annotations

import jinja2
import pytest
import torch

from portachat.model.gguf import GGUFParts, read_gguf
from tests.smollm2 import smollm2_gguf_path

# Tokenizer parity strings: English, code, Chinese, emoji, numbers, whitespace runs, control tokens.
STRINGS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "def f(x):\n    return x ** 2  # square\n",
    "我爱北京天安门。你好，世界！",
    "😀👍🏽 emoji ✨🚀",
    "3.14159 and 2024-11-22, 1000000 + 42",
    "tabs\tand\n\nnewlines   and   spaces   ",
    "<|im_start|>user\nHi there<|im_end|>\n",
    "It's, we're, they'll, I'd've",
    "  leading and trailing  ",
    "naïve café Ünïcödé",
    "for i in range(10):\n\tprint(i)",
    "",
]

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a binary search does.",
    "Give me three tips for learning to cook.",
    "Translate 'good morning' into Spanish.",
]


@pytest.fixture(scope="module")
def parts() -> GGUFParts:
    return read_gguf(smollm2_gguf_path())


def test_smollm2_config_weights_tokenizer(parts):
    """What we read agrees with SmolLM2-135M-Instruct's published config.json and tokenizer."""
    c = parts.config
    expected = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 49152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "max_position_embeddings": 8192,
        "rope_theta": 100000.0,
        "rope_scaling": None,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    assert {k: c[k] for k in expected} == expected
    assert c["rms_norm_eps"] == pytest.approx(1e-5)

    sd = parts.state_dict
    assert len(sd) == 2 + 30 * 9  # embeddings, final norm, 9 tensors per layer; tied: no lm_head
    assert "lm_head.weight" not in sd
    assert sd["model.embed_tokens.weight"].shape == (49152, 576)
    assert sd["model.layers.0.self_attn.k_proj.weight"].shape == (192, 576)
    assert all(t.dtype == torch.float32 and torch.isfinite(t).all() for t in sd.values())

    tok = parts.tokenizer
    assert tok.get_vocab_size() == 49152
    assert [tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [0, 1, 2]
    for s in STRINGS:
        assert tok.decode(tok.encode(s).ids, skip_special_tokens=False) == s
    # llama.cpp's "smollm" pre-tokenizer (SmolLM2's tokenizer.json: Digits then ByteLevel): a whitespace
    # run stays one token before a number, and digits are split one by one.
    assert tok.encode("x =  42").tokens == ["x", "Ġ=", "ĠĠ", "4", "2"]

    tc = parts.tokenizer_config
    assert (tc["bos_token"], tc["eos_token"], tc["pad_token"], tc["unk_token"]) == (
        "<|im_start|>", "<|im_end|>", "<|im_end|>", "<|endoftext|>",
    )  # fmt: skip
    rendered = jinja2.Template(tc["chat_template"]).render(
        messages=[{"role": "user", "content": "Hi"}], add_generation_prompt=True
    )
    assert rendered.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert rendered.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert parts.generation_config == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}


def test_smollm2_tokenizer_matches_transformers(parts):
    transformers = pytest.importorskip("transformers")
    path = smollm2_gguf_path()
    theirs = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    for s in STRINGS:
        assert parts.tokenizer.encode(s).ids == theirs(s)["input_ids"], s
    # Where they differ, transformers is the one off: it has no rule for "smollm" and falls back to
    # GPT-2's regex, which splits "  42" as " " + " 42"; llama.cpp and the original tokenizer.json do not.
    assert parts.tokenizer.encode("x =  42").ids != theirs("x =  42")["input_ids"]


@pytest.mark.slow
def test_smollm2_matches_transformers_weights_logits_greedy(parts):
    """transformers loads the same GGUF: its config and dequantized, unpermuted tensors equal ours; our
    model built from the file (fp32, by portachat's loader) gives its logits and first 32 greedy tokens."""
    transformers = pytest.importorskip("transformers")
    from portachat.engine import SamplingParams
    from portachat.engine.oneshot import generate_once
    from portachat.model.load import load_for_inference

    path = smollm2_gguf_path()
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    hf = hf.eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)

    theirs_config = hf.config.to_dict()
    theirs_config["rope_theta"] = hf.config.rope_parameters["rope_theta"]
    for key in (
        "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
        "rope_theta", "rms_norm_eps", "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id",
    ):  # fmt: skip
        assert parts.config[key] == theirs_config[key], key
    theirs = hf.state_dict()
    assert set(theirs) == set(parts.state_dict) | {"lm_head.weight"}  # transformers lists the tied head too
    for name, tensor in parts.state_dict.items():
        assert torch.allclose(tensor, theirs[name], rtol=0, atol=1e-6), name

    ours = load_for_inference(path, device="cpu", dtype=torch.float32)
    prompts = []
    for text in PROMPTS:
        messages = [{"role": "user", "content": text}]
        ids = ours.tokenizer.render_prompt(messages)
        hf_ids = hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        hf_ids = hf_ids["input_ids"] if hasattr(hf_ids, "keys") else hf_ids
        assert ids == list(hf_ids), text
        prompts.append(ids)

    with torch.no_grad():
        x = torch.tensor([prompts[0]])
        assert torch.allclose(ours.model(x).float(), hf(x).logits, rtol=0, atol=1e-4)

    # transformers' greedy continuation, checked teacher-forced: one forward over prompt + our 32 tokens
    # must put its argmax on each of our tokens (the same sequence its generate(do_sample=False) makes).
    replies = generate_once(ours.model, prompts, SamplingParams(max_tokens=32, temperature=0.0))
    for ids, reply in zip(prompts, replies, strict=True):
        mine = reply.token_ids
        assert len(mine) == 32
        with torch.no_grad():
            logits = hf(torch.tensor([ids + mine])).logits[0]
        theirs = logits[len(ids) - 1 : len(ids) - 1 + 32].argmax(-1).tolist()
        assert mine == theirs, ours.tokenizer.decode(ids)
