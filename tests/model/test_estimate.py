"""The memory estimator against the measured peak of real training steps, and on big HF configs."""

from __future__ import annotations

import json

import pytest
import torch

from portachat.cli import main
from portachat.device import get_device, reset_device_cache
from portachat.model import GPT, GPTConfig
from portachat.model.estimate import TrainingSetup, estimate_kv_cache, estimate_training
from portachat.model.hf import sizes_config
from portachat.train.batch_size import measure_training_peak

QWEN25_7B = {  # Qwen/Qwen2.5-7B-Instruct config.json (the fields that size memory)
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
    "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4, "vocab_size": 152064,
    "tie_word_embeddings": False,
}


@pytest.fixture(autouse=True)
def _cpu(monkeypatch):
    for var in ("PORTACHAT_DEVICE", "PORTACHAT_DTYPE", "PORTACHAT_COMPILE"):
        monkeypatch.delenv(var, raising=False)
    reset_device_cache()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize(
    ("depth", "vocab", "batch", "seq", "dtype", "ckpt"),
    [(2, 384, 4, 128, "fp32", False), (2, 384, 4, 128, "bf16", False), (2, 384, 4, 128, "fp32", True),
     (1, 4096, 2, 128, "bf16", False), (2, 8192, 4, 128, "fp32", False)],  # the last: the loss's chunk weighs
)
def test_estimate_is_within_15_percent_of_the_measured_peak(depth, vocab, batch, seq, dtype, ckpt):
    cfg = GPTConfig.from_depth(depth, vocab, max_seq_len=seq, aspect_ratio=32, head_dim=32)
    measured = measure_training_peak(cfg, batch, seq, get_device("cpu", dtype=dtype), activation_checkpointing=ckpt)
    est = estimate_training(cfg, TrainingSetup(batch, seq, dtype, activation_checkpointing=ckpt))
    assert est["num_params"] == GPT(cfg).num_params()
    assert abs(est["peak_bytes"] / measured - 1) < 0.15, (est["peak_bytes"], measured)


def test_hf_7b_config_on_one_and_eight_devices():
    cfg = sizes_config(QWEN25_7B)
    assert abs(cfg.num_params() - 7.615e9) / 7.615e9 < 0.01  # Qwen2.5-7B has 7.62B parameters
    one = estimate_training(cfg, TrainingSetup(1, 4096, "bf16", "adamw"))
    c = one["components"]
    assert c["parameters"] == 4 * cfg.num_params() and c["optimizer_states"] == 8 * cfg.num_params()
    fsdp = estimate_training(cfg, TrainingSetup(1, 4096, "bf16", "adamw", world_size=8, parallel="fsdp2"))
    ddp = estimate_training(cfg, TrainingSetup(1, 4096, "bf16", "adamw", world_size=8, parallel="ddp"))
    assert fsdp["components"]["parameters"] * 8 == pytest.approx(c["parameters"])
    assert fsdp["peak_bytes"] < 80 * 2**30 < ddp["peak_bytes"]  # 7B full fine-tuning fits 8x80GB only sharded
    ckpt = estimate_training(cfg, TrainingSetup(1, 4096, "bf16", "adamw", True, 8, "fsdp2"))
    assert ckpt["components"]["activations"] < fsdp["components"]["activations"] / 5


def test_kv_cache_matches_the_formula_and_grows_linearly():
    cfg = sizes_config(QWEN25_7B)
    kv = estimate_kv_cache(cfg, batch_size=1, context=1000, dtype="bf16")
    assert kv["kv_bytes_per_token"] == 2 * 28 * 4 * 128 * 2  # K and V, 28 layers, 4 KV heads of 128, bf16
    assert estimate_kv_cache(cfg, 4, 1000)["kv_cache_bytes"] == 4 * kv["kv_cache_bytes"]


def test_int8_and_fp8_kv_caches_count_their_scales_and_keep_bf16_weights(tmp_path, capsys):
    cfg = sizes_config(QWEN25_7B)
    bf16 = estimate_kv_cache(cfg, 8, 1000, dtype="bf16")
    for dtype in ("int8", "fp8"):
        q = estimate_kv_cache(cfg, 8, 1000, dtype=dtype)
        assert q["kv_bytes_per_token"] == 2 * 28 * 4 * (128 + 4)  # a byte per value, an fp32 scale per head
        assert q["weights_dtype"] == "bf16" and q["weights_bytes"] == bf16["weights_bytes"]
        assert 1.9 < bf16["kv_cache_bytes"] / q["kv_cache_bytes"] < 2
    with pytest.raises(ValueError, match="int8, fp8"):
        estimate_kv_cache(cfg, 1, 10, dtype="int4")
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_7B))
    assert main(["estimate", "memory", "--hf-config", str(tmp_path), "--kv-dtype", "int8", "--json"]) == 0
    serving = json.loads(capsys.readouterr().out)["serving"]
    assert serving["dtype"] == "int8" and serving["kv_bytes_per_token"] == 2 * 28 * 4 * 132


def test_cli_json_and_errors(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_7B))
    run = ["estimate", "memory"]
    assert main([*run, "--hf-config", str(tmp_path), "--devices", "8", "--parallel", "fsdp2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["training"]["setup"]["parallel"] == "fsdp2" and out["serving"]["kv_cache_bytes"] > 0
    assert main([*run, "--depth", "4", "--activation-checkpointing"]) == 0
    table = capsys.readouterr().out
    assert "PEAK" in table and "KV cache" in table and "activations with checkpointing" in table
    assert main([*run, "--hf-config", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_cli_measure_compares_with_a_real_step(capsys):
    argv = ["estimate", "memory", "--depth", "1", "--vocab-size", "384", "--device-batch-size", "2",
            "--max-seq-len", "64", "--dtype", "fp32", "--device", "cpu", "--measure", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert abs(out["training"]["peak_bytes"] / out["measured_peak_bytes"] - 1) < 0.15
    assert main(["estimate", "memory", "--hf-config", "x", "--measure"]) == 2


def test_data_sizes_the_micro_batch_by_its_real_lengths(tmp_path, capsys, small_tokenizer):
    from portachat.data.chat_data import synthetic_conversations
    from portachat.device.shapes import pad_bucket
    from portachat.tokenizer import render_conversation

    convs = synthetic_conversations(40, seed=3)
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": c["messages"]}) + "\n" for c in convs))
    small_tokenizer.save(tmp_path / "tok")
    run = ["estimate", "memory", "--depth", "2", "--vocab-size", "384", "--device-batch-size", "4", "--json"]
    assert main(run) == 0
    padded = json.loads(capsys.readouterr().out)["training"]
    assert main([*run, "--data", str(data), "--tokenizer", str(tmp_path / "tok")]) == 0
    real = json.loads(capsys.readouterr().out)["training"]
    rendered = [render_conversation(small_tokenizer, c["messages"], 2049) for c in convs]
    longest = max(len(ids) - 1 for ids, _ in rendered)
    assert real["data"]["longest"] == longest and real["setup"]["seq_len"] == pad_bucket(longest, 2048) < 2048
    assert real["setup"]["supervised_tokens"] == 4 * max(sum(m[1:]) for _, m in rendered)
    assert real["peak_bytes"] < padded["peak_bytes"] / 4
    assert main([*run, "--data", str(data), "--tokenizer", str(tmp_path / "tok"), "--tokens-per-batch", "1024"]) == 0
    budget = json.loads(capsys.readouterr().out)["training"]
    assert budget["tokens_per_micro_batch"] <= 1024
    assert main([*run, "--data", str(data)]) == 2  # nothing to render it with
    assert "--tokenizer" in capsys.readouterr().err


def test_sizes_config_reads_any_decoder_family_and_agrees_with_the_strict_mapping():
    from portachat.model.hf import UnsupportedConfigError, from_hf_config

    assert sizes_config(QWEN25_7B) == from_hf_config(QWEN25_7B)  # a family we run: the same GPTConfig
    mistral = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
               "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
               "num_key_value_heads": 8, "vocab_size": 32768, "sliding_window": 4096}  # fmt: skip
    with pytest.raises(UnsupportedConfigError):
        from_hf_config(mistral)
    cfg = sizes_config({"text_config": mistral})  # the text part of a multimodal config
    assert (cfg.n_layer, cfg.n_kv_head, cfg.head_dim, cfg.qk_norm, cfg.attention_bias) == (32, 8, 128, False, False)
    assert abs(cfg.num_params() - 7.248e9) / 7.248e9 < 0.01  # Mistral-7B-v0.3 has 7.25B parameters
    with pytest.raises(UnsupportedConfigError, match="hidden_size"):
        sizes_config({"model_type": "llama", "vocab_size": 10})
