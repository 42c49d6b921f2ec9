"""`estimate memory --serve -tp N`: per-device numbers equal what the shards really hold."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from portachat.cli import main
from portachat.model import GPT, GPTConfig
from portachat.model.serve_memory import ModelTooBig, check_fits, estimate_serving, smallest_tp
from portachat.model.tensor_parallel import shard_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
from gpt_testing import tiny_config  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("overrides,tp", [
    (dict(n_head=4, n_kv_head=2, attention_bias=True, qk_norm=False), 2),
    (dict(n_head=6, n_kv_head=3, n_embd=96), 2),  # uneven: rank 0 holds the larger share
    (dict(n_head=8, n_kv_head=2, head_dim=8), 4),  # kv heads replicated
])  # fmt: skip
def test_per_device_weights_and_kv_match_the_real_shard(overrides, tp):
    cfg = tiny_config(**overrides)
    model = GPT(cfg)
    shard_model(model, 0, tp)
    held = sum(p.numel() for p in model.parameters()) * 4
    kv_per_token = 2 * model.config.n_layer * model.config.n_kv_head * model.config.head_dim * 4
    est = estimate_serving(cfg, tp, "fp32", batch_size=2, context=16)
    assert est["weights_bytes_per_device"] == held
    assert est["kv_bytes_per_token_per_device"] == kv_per_token


def test_what_fits_and_the_smallest_size_that_does():
    cfg = GPTConfig(vocab_size=32000, n_layer=8, n_embd=1024, n_head=16, n_kv_head=8, head_dim=64,
                    intermediate_size=4096)
    one = estimate_serving(cfg, 1, "bf16", batch_size=4, context=1024)
    budget = int(one["total_bytes_per_device"] * 0.7)  # too small for one device, enough for two
    est = estimate_serving(cfg, 1, "bf16", 4, 1024, device_bytes=budget, utilization=1.0)
    assert not est["fits"] and est["smallest_tp_that_fits"] == 2
    assert est["kv_tokens_that_fit"] == 0  # not even the weights fit
    roomy = estimate_serving(cfg, 1, "bf16", 4, 1024, device_bytes=10 * budget, utilization=1.0)
    kv_room = 10 * budget - one["weights_bytes_per_device"] - one["activations_bytes_per_device"]
    assert roomy["kv_tokens_that_fit"] == kv_room // one["kv_bytes_per_token_per_device"]
    assert roomy["sequences_that_fit"] == roomy["kv_tokens_that_fit"] // 1024
    assert smallest_tp(cfg, "bf16", 4, 1024, budget=1) is None
    two = estimate_serving(cfg, 2, "bf16", 4, 1024, device_bytes=budget, utilization=1.0)
    assert two["fits"] and two["weights_bytes_per_device"] < one["weights_bytes_per_device"]


def test_cli_prints_the_serving_table(tmp_path, capsys):
    (tmp_path / "config.json").write_text(
        '{"architectures":["Qwen2ForCausalLM"],"model_type":"qwen2","hidden_size":5120,"intermediate_size":27648,'
        '"num_hidden_layers":64,"num_attention_heads":40,"num_key_value_heads":8,"vocab_size":152064}')
    run = ["estimate", "memory", "--hf-config", str(tmp_path), "--serve", "--device-memory-gb", "64", "--kv-context", "8192"]
    assert main([*run, "-tp", "1"]) == 0
    out = capsys.readouterr().out
    assert "KV cache per token" in out and "smallest -tp that fits is 2" in out
    assert main([*run, "-tp", "9"]) == 2  # 40 q heads over 8 kv heads: 1-8 or 40 ranks
    assert "sizes that work: 1, 2, 3, 4, 5, 6, 7, 8" in capsys.readouterr().err


def test_check_fits_names_the_smallest_size_that_fits():
    cfg = GPTConfig(vocab_size=32000, n_layer=8, n_embd=1024, n_head=16, n_kv_head=8, head_dim=64,
                    intermediate_size=4096)
    need = estimate_serving(cfg, 1, "bf16", batch_size=1, context=1024)["total_bytes_per_device"]
    check_fits(cfg, 1, "bf16", 1024, int(need / 0.89), "cfg")  # fits: no error
    with pytest.raises(ModelTooBig, match=r"at -tp 1 in bf16 .*serve it with --tensor-parallel-size 2 .*--serve -tp 2"):
        check_fits(cfg, 1, "bf16", 1024, int(need * 0.8), "cfg")
    weights = estimate_serving(cfg, 1, "bf16", 1, 1024)["weights_bytes_per_device"]
    with pytest.raises(ModelTooBig, match="or lower --max-model-len"):  # weights fit, a 64k-token sequence does not
        check_fits(cfg, 1, "bf16", 65536, int(weights / 0.85), "cfg")


def test_serve_refuses_a_model_too_big_before_reading_any_weight(tmp_path):
    from portachat.engine.loading import LoadOptions, load_served_model

    # ~1.6e13 parameters and no weight file: the refusal must come before the loader looks for one.
    (tmp_path / "config.json").write_text(
        '{"architectures":["Qwen2ForCausalLM"],"model_type":"qwen2","hidden_size":32768,"intermediate_size":131072,'
        '"num_hidden_layers":1000,"num_attention_heads":256,"num_key_value_heads":8,"vocab_size":152064}')
    with pytest.raises(ModelTooBig, match="the model does not fit: at -tp 1 in fp32"):
        load_served_model(LoadOptions(model=str(tmp_path), device="cpu", dtype="fp32"))


def test_the_serving_table_and_refusal_in_chinese_stay_aligned(monkeypatch):
    from portachat.i18n.width import display_width
    from portachat.model.serve_memory import format_serving

    cfg = GPTConfig(vocab_size=32000, n_layer=8, n_embd=1024, n_head=16, n_kv_head=8, head_dim=64,
                    intermediate_size=4096)
    need = estimate_serving(cfg, 1, "bf16", batch_size=1, context=1024)["total_bytes_per_device"]
    monkeypatch.setenv("PORTACHAT_LANG", "zh")
    est = estimate_serving(cfg, 1, "bf16", batch_size=1, context=1024, device_bytes=int(need * 0.8))
    text = format_serving(est)
    assert "组成部分（每个设备）" in text and "放不下：能放下的最小 -tp 是 2" in text
    rows = [line for line in text.splitlines() if line.endswith(("MiB", "KiB", "GiB", " B"))]
    assert len(rows) == 5 and len({display_width(line) for line in rows}) == 1  # one right edge
    with pytest.raises(ModelTooBig, match=r"模型放不下：在 -tp 1、bf16 下.*请用 --tensor-parallel-size 2 提供服务"):
        check_fits(cfg, 1, "bf16", 1024, int(need * 0.8), "cfg")
