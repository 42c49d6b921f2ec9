"""Batch-size tuning with real training steps under a memory limit; OOM recognition; checkpointing."""

from __future__ import annotations

import json

import pytest
import torch

from portachat.cli import main
from portachat.device import get_device, reset_device_cache
from portachat.model import GPT, GPTConfig
from portachat.train.accumulation import TrainingError, grad_accum_steps, largest_dividing_batch
from portachat.train.activation_checkpointing import apply_activation_checkpointing
from portachat.train.batch_size import (
    find_batch_size,
    is_out_of_memory,
    measure_training_peak,
)

TINY = dict(vocab_size=384, max_seq_len=64, aspect_ratio=32, head_dim=32)


@pytest.fixture(autouse=True)
def _cpu(monkeypatch):
    for var in ("PORTACHAT_DEVICE", "PORTACHAT_DTYPE", "PORTACHAT_COMPILE"):
        monkeypatch.delenv(var, raising=False)
    reset_device_cache()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_find_batch_size_respects_the_memory_limit():
    cfg = GPTConfig.from_depth(1, **TINY)
    dev = get_device("cpu", dtype="fp32")
    limit = 6 * 2**20
    result = find_batch_size(cfg, 64, dev, memory_limit=limit, safety=0.9, max_batch_size=64)
    assert result.batch_size >= 1
    by_batch = {p.batch_size: p for p in result.probes}
    assert by_batch[result.batch_size].fits and by_batch[result.batch_size].peak_bytes <= 0.9 * limit
    above = min(b for b, p in by_batch.items() if not p.fits)
    assert above == result.batch_size + 1 and by_batch[above].peak_bytes > 0.9 * limit
    bigger = find_batch_size(cfg, 64, dev, memory_limit=3 * limit, max_batch_size=2 * result.batch_size + 2)
    assert bigger.batch_size > result.batch_size


def test_vendor_out_of_memory_errors_are_recognised():
    for message in ("CUDA out of memory. Tried to allocate 2.00 GiB", "NPU out of memory. Tried to allocate",
                    "HIP out of memory", "XPU out of memory", "MPS backend out of memory"):
        assert is_out_of_memory(RuntimeError(message)), message
    assert is_out_of_memory(torch.OutOfMemoryError("x")) and is_out_of_memory(MemoryError())
    assert not is_out_of_memory(RuntimeError("shape mismatch"))


def test_grad_accum_from_total_batch():
    assert grad_accum_steps(524288, 32, 2048, world_size=8) == 1
    assert grad_accum_steps(524288, 8, 2048, world_size=2) == 16
    # One rule for the trainer and the finder (the trainer's won: a step sees exactly the total asked for;
    # the finder's old round-up trained on a different batch than the learning rate was set for).
    with pytest.raises(TrainingError, match="not a multiple"):
        grad_accum_steps(1000, 4, 256)
    assert grad_accum_steps(None, 4, 256) == 1
    assert largest_dividing_batch(7, 4096, 64) == 4 and largest_dividing_batch(7, None, 64) == 7


def test_activation_checkpointing_same_gradients_less_memory():
    cfg = GPTConfig.from_depth(2, **TINY)
    torch.manual_seed(0)
    plain = GPT(cfg)
    ckpt = GPT(cfg)
    ckpt.load_state_dict(plain.state_dict())
    assert apply_activation_checkpointing(ckpt) == 2
    assert list(ckpt.state_dict()) == list(plain.state_dict())
    x = torch.randint(0, 384, (2, 64))
    for model in (plain, ckpt):
        model(x, x).backward()
    for (name, a), b in zip(plain.named_parameters(), ckpt.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6, msg=name)
    dev = get_device("cpu", dtype="fp32")
    assert measure_training_peak(cfg, 8, 64, dev, True) < 0.8 * measure_training_peak(cfg, 8, 64, dev, False)
    with torch.no_grad():  # inference runs the blocks as they are
        torch.testing.assert_close(ckpt(x), plain(x))


def test_cli_tune_with_memory_limit(capsys):
    argv = ["tune", "batch-size", "--device", "cpu", "--dtype", "fp32", "--depth", "1", "--vocab-size", "384",
            "--max-seq-len", "64", "--memory-limit", "8MiB", "--max-batch-size", "32", "--total-batch-size", "4096"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["limit_bytes"] == 8 * 2**20 and 1 <= out["device_batch_size"] < 32
    fitting = [p for p in out["probes"] if p["batch_size"] == out["device_batch_size"]]
    assert fitting[0]["peak_bytes"] <= 0.9 * 8 * 2**20
    batch = out["device_batch_size_for_total"]
    assert batch <= out["device_batch_size"] and 4096 % (batch * 64) == 0
    assert out["grad_accum_steps"] == 4096 // (batch * 64)
    with pytest.raises(SystemExit) as bad:
        main(["tune", "batch-size", "--memory-limit", "lots"])
    assert bad.value.code == 2 and "24GiB" in capsys.readouterr().err


def test_device_batch_size_auto_derives_accumulation_from_the_total():
    from portachat.train.batch_size import auto_device_batch_size, parse_device_batch_size

    assert parse_device_batch_size("auto") == "auto" and parse_device_batch_size("8") == 8
    with pytest.raises(ValueError, match="positive integer or auto"):
        parse_device_batch_size("0")
    cfg = GPTConfig.from_depth(1, **TINY)
    dev = get_device("cpu", dtype="fp32")
    batch, accum = auto_device_batch_size(cfg, 64, dev, total_batch_tokens=64 * 4, memory_limit=2**30)
    assert (batch, accum) == (4, 1)  # plenty of memory: capped by the total batch, no accumulation
    small, accum = auto_device_batch_size(cfg, 64, dev, total_batch_tokens=64 * 16, memory_limit=5 * 2**20)
    assert 1 <= small < 16 and accum == -(-16 // small)


def test_device_batch_size_auto_probes_the_rows_the_data_really_has():
    from portachat.train.batch_size import auto_device_batch_size

    cfg = GPTConfig.from_depth(1, **TINY)
    dev = get_device("cpu", dtype="fp32")
    said: list[str] = []
    full, _ = auto_device_batch_size(cfg, 64, dev, None, memory_limit=5 * 2**20)
    short, _ = auto_device_batch_size(cfg, 64, dev, None, memory_limit=5 * 2**20, row_len=16, say=said.append)
    assert short > full  # rows of 16 real tokens: more of them fit than rows of 64
    assert any("16 tokens" in m for m in said)


def test_a_token_budget_counts_micro_batches_by_the_budget_under_the_same_rule():
    # --tokens-per-batch: a micro-batch is the budget, not rows x sequence; exact or refused as without it.
    assert grad_accum_steps(8192, 99, 512, world_size=2, tokens_per_batch=1024) == 4
    assert grad_accum_steps(None, 99, 512, tokens_per_batch=1024) == 1
    with pytest.raises(TrainingError, match="multiple of --tokens-per-batch"):
        grad_accum_steps(3000, 4, 512, tokens_per_batch=1024)
    with pytest.raises(TrainingError, match="below --max-seq-len"):
        grad_accum_steps(8192, 4, 512, tokens_per_batch=256)
