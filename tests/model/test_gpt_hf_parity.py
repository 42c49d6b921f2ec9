from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from gpt_testing import randomized, tiny_config
from safetensors.torch import save_file

from portachat.engine import SamplingParams
from portachat.engine.oneshot import generate_once
from portachat.model import (
    GPT,
    GPTConfig,
    UnsupportedConfigError,
    exportable,
    from_hf_config,
    generation_config,
    to_hf_config,
)

transformers = pytest.importorskip("transformers")


def save_hf_dir(model: GPT, directory: Path) -> Path:
    state = {name: t.detach().contiguous() for name, t in model.state_dict().items()}
    if model.config.tie_embeddings:
        del state["lm_head.weight"]  # HF re-ties it from tie_word_embeddings
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(to_hf_config(model.config, bos_id=1, eos_id=2)))
    (directory / "generation_config.json").write_text(json.dumps(generation_config(bos_id=1, eos_id=2)))
    return directory


def load_hf(directory: Path):
    return transformers.AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()


@pytest.mark.parametrize("tied", [False, True])
def test_transformers_loads_checkpoint_with_equal_logits(tmp_path, tied):
    torch.manual_seed(0)
    model = randomized(GPT(tiny_config(tie_embeddings=tied, rope_theta=50000.0)))
    hf = load_hf(save_hf_dir(model, tmp_path))
    assert type(hf).__name__ == "Qwen3ForCausalLM"
    assert (hf.lm_head.weight is hf.model.embed_tokens.weight) == tied
    idx = torch.randint(0, 128, (2, 23))
    with torch.no_grad():
        ours, theirs = model(idx), hf(idx).logits
    assert ours.abs().max() > 1.0  # the comparison is not between near-zero logits
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


def test_greedy_generate_matches_transformers(tmp_path):
    torch.manual_seed(1)
    model = randomized(GPT(tiny_config()), seed=1, std=0.5)
    hf = load_hf(save_hf_dir(model, tmp_path))
    prompt = [1, 17, 42, 99, 5]
    ours = generate_once(model, [prompt], SamplingParams(max_tokens=12, temperature=0.0))[0].token_ids
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    theirs = out[0, len(prompt) :].tolist()
    assert ours == theirs
    assert len(set(ours)) > 1  # a degenerate repeated token would make the comparison weak


def test_hf_config_round_trip_and_fields():
    cfg = GPTConfig.from_depth(4, vocab_size=1000, max_seq_len=1024, kv_head_ratio=2, tie_embeddings=True)
    d = to_hf_config(cfg, bos_id=3, eos_id=[4, 5], pad_id=0, dtype=torch.bfloat16)
    assert d["architectures"] == ["Qwen3ForCausalLM"] and d["model_type"] == "qwen3"
    assert d["torch_dtype"] == d["dtype"] == "bfloat16"
    assert (
        d["rope_parameters"] == {"rope_type": "default", "rope_theta": 10000.0} and d["rope_theta"] == 10000.0
    )
    assert (d["num_attention_heads"], d["num_key_value_heads"], d["head_dim"]) == (2, 1, 128)
    assert (d["bos_token_id"], d["eos_token_id"], d["pad_token_id"]) == (3, [4, 5], 0)
    assert from_hf_config(d) == cfg
    assert from_hf_config(json.loads(json.dumps(d))) == cfg
    hf_cfg = transformers.Qwen3Config(
        **{k: v for k, v in d.items() if k not in ("architectures", "model_type")}
    )
    assert from_hf_config({**hf_cfg.to_dict(), "architectures": ["Qwen3ForCausalLM"]}) == cfg
    assert exportable(cfg) == (True, "maps onto Qwen3ForCausalLM")


def test_from_hf_config_reads_a_transformers_4_style_config():
    # Qwen3-0.6B's config.json as written by transformers 4.x: rope_theta at top level, no
    # rope_parameters, and attention wider than the model (16 heads x 128 = 2048 > hidden 1024).
    d = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
        "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu",
        "max_position_embeddings": 40960, "rms_norm_eps": 1e-06, "rope_scaling": None,
        "rope_theta": 1000000, "tie_word_embeddings": True, "attention_bias": False,
        "use_sliding_window": False, "sliding_window": None, "torch_dtype": "bfloat16",
    }  # fmt: skip
    cfg = from_hf_config(d)
    assert (cfg.n_embd, cfg.n_head, cfg.n_kv_head, cfg.head_dim) == (1024, 16, 8, 128)
    assert cfg.rope_theta == 1e6 and cfg.tie_embeddings and cfg.max_seq_len == 40960


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]},
            r"model_type='gpt2' .* is not supported; supported families: llama \(SmolLM2 included\), qwen2, qwen3",
        ),
        ({"architectures": ["Qwen3ForSequenceClassification"]}, "only Qwen3ForCausalLM is"),
        ({"attention_bias": True}, "attention_bias=true is not supported"),
        ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4}}, "needs \\['factor'\\]"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu' is not supported"),
        ({"use_sliding_window": True}, "sliding-window attention is not supported"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}}, "rope type 'yarn'"),
        (
            {"layer_types": ["full_attention", "sliding_attention"]},
            "layer_types must all be 'full_attention'",
        ),
        ({"num_key_value_heads": 3}, "must be a multiple of n_kv_head"),
    ],
)
def test_from_hf_config_rejects_what_it_cannot_run(change, message):
    d = {**to_hf_config(tiny_config(), bos_id=1, eos_id=2), **change}
    with pytest.raises(ValueError, match=message):
        from_hf_config(d)


def test_from_hf_config_missing_field():
    d = to_hf_config(tiny_config(), bos_id=1, eos_id=2)
    del d["intermediate_size"]
    with pytest.raises(UnsupportedConfigError, match="lacks the required field 'intermediate_size'"):
        from_hf_config(d)


def test_bad_checkpoint_dtype():
    with pytest.raises(UnsupportedConfigError, match="dtype must be float32, bfloat16 or float16"):
        to_hf_config(tiny_config(), bos_id=1, eos_id=2, dtype="int8")
