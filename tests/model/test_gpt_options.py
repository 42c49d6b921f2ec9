"""The family options of GPTConfig (QK-norm, q/k/v biases, rope scaling, architecture), the
RMSNorm dtype rule under autocast, and compatibility with configs saved before the options."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from gpt_testing import randomized, tiny_config
from torch import nn

import portachat.model.gpt as gpt_module
from portachat.device import get_device
from portachat.model import (
    GPT,
    ConfigError,
    GPTConfig,
    UnsupportedConfigError,
    exportable,
    from_hf_config,
    to_hf_config,
)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"qk_norm": False, "architecture": "llama"},
        {"qk_norm": False, "attention_bias": True, "architecture": "qwen2"},
        {"qk_norm": False, "tie_embeddings": True, "rope_scaling": {"type": "linear", "factor": 2}},
    ],
)
def test_options_build_the_right_modules_and_count(options):
    cfg = tiny_config(**options)
    model = GPT(cfg)
    attn = model.model.layers[0].self_attn
    assert isinstance(attn.q_norm, nn.Identity) != cfg.qk_norm
    assert (attn.q_proj.bias is not None) == (attn.k_proj.bias is not None) == cfg.attention_bias
    assert attn.o_proj.bias is None
    if cfg.attention_bias:
        assert attn.v_proj.bias.abs().sum() == 0  # init: biases start at zero
    assert model.num_params() == cfg.num_params()
    groups = model.param_groups()
    assert sum(len(g) for g in groups.values()) == len(list(model.parameters()))


def test_public_rotary_honours_scaling():
    plain = GPT(tiny_config())
    scaled = GPT(tiny_config(rope_scaling={"rope_type": "linear", "factor": 4.0}))
    cos, sin = plain.rotary(40)
    assert cos.shape == sin.shape == (40, 16) and cos.dtype == torch.float32
    cos4, _ = scaled.rotary(40, device="cpu")
    torch.testing.assert_close(cos4[8], cos[2])  # linear scaling: position 8 turns like position 2
    long_cos, _ = plain.rotary(5000)  # past max_seq_len: grows
    assert long_cos.shape == (5000, 16)


@pytest.mark.parametrize("options", [{}, {"qk_norm": False, "attention_bias": True, "architecture": "qwen2"}])
def test_q_k_v_reach_attention_in_the_compute_dtype_under_autocast(monkeypatch, options):
    seen = []
    real = gpt_module.attention

    def spy(q, k, v, **kwargs):
        seen.append((q.dtype, k.dtype, v.dtype))
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(gpt_module, "attention", spy)
    model = randomized(GPT(tiny_config(**options)))
    dev = get_device("cpu", dtype="bf16")
    assert dev.dtype == torch.bfloat16
    with dev.autocast():
        loss = model(torch.randint(0, 128, (2, 12)), targets=torch.randint(0, 128, (2, 12)))
    loss.backward()
    assert seen and all(d == (torch.bfloat16,) * 3 for d in seen), seen
    # RMSNorm keeps its input's dtype, whatever the weight's dtype.
    norm = gpt_module.RMSNorm(16, 1e-6)
    assert norm(torch.randn(3, 16, dtype=torch.bfloat16)).dtype == torch.bfloat16
    assert norm(torch.randn(3, 16)).dtype == torch.float32


def test_configs_saved_before_the_options_still_load():
    old = {
        "vocab_size": 128, "n_layer": 2, "n_embd": 64, "n_head": 4, "n_kv_head": 2, "head_dim": 16,
        "intermediate_size": 160, "max_seq_len": 2048, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
        "tie_embeddings": False,
    }  # fmt: skip
    cfg = GPTConfig.from_dict(old)
    assert (cfg.qk_norm, cfg.attention_bias, cfg.rope_scaling, cfg.architecture) == (True, False, None, "qwen3")
    assert cfg == tiny_config()
    assert GPTConfig.from_dict(cfg.to_dict()) == cfg
    # An old config.json (no rope_scaling / attention_bias keys) reads as the same Qwen3 model.
    d = to_hf_config(cfg, bos_id=1, eos_id=2)
    for key in ("attention_bias", "rope_parameters"):
        d.pop(key)
    assert from_hf_config(d) == cfg


@pytest.mark.parametrize(
    "options, message",
    [
        ({"architecture": "mistral"}, "architecture must be one of qwen3, qwen2, llama"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "'yarn' is not supported; supported types are linear, llama3"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "needs \\['low_freq_factor'"),
        ({"rope_scaling": {"rope_type": "linear", "factor": -1}}, "factor must be a positive number"),
    ],
)
def test_bad_options_are_clear_errors(options, message):
    with pytest.raises(ConfigError, match=message):
        tiny_config(**options)


def test_exportable_is_honest_and_each_family_round_trips():
    for arch, qk, bias in (("qwen3", True, False), ("qwen2", False, True), ("llama", False, False)):
        cfg = tiny_config(qk_norm=qk, attention_bias=bias, architecture=arch, rope_scaling={"type": "linear", "factor": 2})
        assert exportable(cfg)[0]
        d = to_hf_config(cfg, bos_id=1, eos_id=2)
        assert d["model_type"] == arch and d["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}
        assert from_hf_config(d) == cfg
    odd = tiny_config(qk_norm=False)  # no QK-norm but saved as qwen3: no HF class has that
    ok, reason = exportable(odd)
    assert not ok and "does not match Qwen3ForCausalLM" in reason and "llama: neither" in reason
    with pytest.raises(UnsupportedConfigError, match="cannot be exported as Qwen3ForCausalLM"):
        to_hf_config(odd, bos_id=1, eos_id=2)


def test_non_exportable_checkpoint_saves_and_loads_exactly(tmp_path):
    from portachat.model.model_dir import load_model_dir, save_model_files
    from portachat.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(["hello world, the cat sat on the mat."] * 20, vocab_size=300, verbose=False)
    cfg = dataclasses.replace(tiny_config(vocab_size=320), qk_norm=False)  # qwen3 without QK-norm
    model = randomized(GPT(cfg))
    save_model_files(tmp_path, model, tokenizer, meta={"stage": "base", "step": 1})
    loaded = load_model_dir(tmp_path)
    assert loaded.model.config == cfg and loaded.meta["exportable"] is False
    idx = torch.tensor([[1, 2, 3, 4]])
    torch.testing.assert_close(loaded.model.eval()(idx), model(idx))
