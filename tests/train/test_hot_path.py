"""The training hot path on a CPU: the GC frozen inside the step loop, one host transfer per step,
memory stats only on logged steps, the loader's waits in log.jsonl and on the progress line, and MFU
counting attention as the causal kernel computes it."""

from __future__ import annotations

import gc
import json
import os
import sys
import time

import pytest
import torch
from test_trainer import RepeatingStream, _setup

import portachat
from portachat.device import Device, dist_env, get_device
from portachat.device.flops import attention_flops_per_token
from portachat.train.hot_path import causal_flops_per_token
from portachat.train.logger import format_progress
from portachat.train.step import clip_and_step
from portachat.train.trainer import Trainer, train


def test_the_collector_is_frozen_and_off_inside_the_loop_and_back_after(small_tokenizer, tmp_path):
    model, data, tc = _setup(small_tokenizer, steps=4, eval_every=2)
    seen: list[tuple[bool, int]] = []
    collects: list[int] = []
    data.step_metrics = lambda: seen.append((gc.isenabled(), gc.get_freeze_count())) or {}
    gc.callbacks.append(lambda phase, info: collects.append(info["generation"]) if phase == "start" else None)
    try:
        train(model, small_tokenizer, data, tc, get_device("cpu"), dist_env(), tmp_path / "s", print_fn=lambda _m: None)
    finally:
        gc.callbacks.pop()
    assert len(seen) == 4 and all(not enabled and frozen > 0 for enabled, frozen in seen)
    assert gc.isenabled() and gc.get_freeze_count() == 0
    assert collects.count(2) >= 3  # full collections at the freeze, the evaluations and the save


# The package itself, not any path with "portachat" in it (a checkout named portachat holds .venv/.../torch too).
PACKAGE_DIR = os.path.dirname(portachat.__file__) + os.sep


def test_a_step_reads_the_device_once(small_tokenizer, tmp_path, monkeypatch):
    model, data, tc = _setup(small_tokenizer, steps=6, log_every=3, grad_clip=1.0)
    dev = get_device("cpu")
    trainer = Trainer(model, small_tokenizer, data, tc, dev, dist_env(), tmp_path / "s", print_fn=lambda _m: None)
    trainer.setup()
    trainer.step()  # warm-up outside the count (lazy initialisation may read values once)
    calls = {"item": 0, "tolist": 0, "synchronize": 0, "memory": 0}

    def counting(name, original):
        def wrapper(*args, **kwargs):
            # portachat's reads only: torch's AdamW reads its step counters, host tensors by design
            calls[name] += sys._getframe(1).f_code.co_filename.startswith(PACKAGE_DIR)
            return original(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(torch.Tensor, "item", counting("item", torch.Tensor.item))
    monkeypatch.setattr(torch.Tensor, "tolist", counting("tolist", torch.Tensor.tolist))
    monkeypatch.setattr(Device, "synchronize", counting("synchronize", Device.synchronize))
    monkeypatch.setattr(Device, "memory", counting("memory", Device.memory))
    records = [trainer.step()[0] for _ in range(5)]  # steps 2..6: 3 and 6 are logged
    assert calls == {"item": 0, "tolist": 5, "synchronize": 0, "memory": 2}
    assert [("mem_bytes" in r) for r in records] == [False, True, False, False, True]
    assert all(r["grad_norm"] is not None and r["grad_norm"] > 0 for r in records)


def test_clipping_uses_the_norm_read_with_the_loss(small_tokenizer, tmp_path):
    model, data, tc = _setup(small_tokenizer, steps=1, grad_clip=1e-3)
    trainer = Trainer(model, small_tokenizer, data, tc, get_device("cpu"), dist_env(), tmp_path / "s",
                      print_fn=lambda _m: None)
    trainer.setup()
    stats = trainer.forward_backward(trainer.next_micro_batches())
    before = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
    assert stats.grad_norm == pytest.approx(float(before), rel=1e-5)
    applied, norm = clip_and_step(model, trainer.optimizers, None, 1e-3, stats, trainer.grad_norm)
    assert applied and norm == stats.grad_norm


class SlowStream(RepeatingStream):
    def next_batch(self):
        time.sleep(0.03)
        return super().next_batch()


def test_loader_waits_are_logged_and_shown(small_tokenizer, tmp_path):
    model, data, tc = _setup(small_tokenizer, steps=3)
    vocab = small_tokenizer.vocab_size
    data.make_stream = lambda s, n: SlowStream(vocab, 4, 16, s * 1000)
    data.prefetch = 1
    lines: list[str] = []
    train(model, small_tokenizer, data, tc, get_device("cpu"), dist_env(), tmp_path / "w", print_fn=lines.append)
    log = [json.loads(x) for x in (tmp_path / "w" / "log.jsonl").read_text().splitlines()]
    waits = [r["loader_wait_s"] for r in log if "loss" in r]
    assert len(waits) == 3 and all(w >= 0.0 for w in waits) and waits[0] >= 0.02  # the first batch is never ready
    assert any("ms/step (load" in line for line in lines)
    assert log[0] == {**log[0], "mfu_attention": "causal"}


def test_progress_line_shows_the_loader_wait():
    record = {"loss": 1.0, "lr_mult": 1.0, "tok_per_s": 10.0, "mfu": 0.1, "dt_s": 0.2, "loader_wait_s": 0.05}
    assert "200 ms/step (load 50 ms)" in format_progress(1, 10, record, 1.0)
    assert "(load" not in format_progress(1, 10, {**record, "loader_wait_s": None}, 1.0)


def test_mfu_counts_causal_attention_as_half_of_full(small_tokenizer):
    model, _data, _tc = _setup(small_tokenizer, steps=1)
    c = model.config
    assert attention_flops_per_token(2, 4, 64, 1024) == 6.0 * 2 * 4 * 64 * 1024
    assert attention_flops_per_token(2, 4, 64, 1024, causal=False) == 12.0 * 2 * 4 * 64 * 1024
    matmuls = 6.0 * model.num_params(exclude_embedding=True)
    assert causal_flops_per_token(model, 16) == pytest.approx(matmuls + 6.0 * c.n_layer * c.n_head * c.head_dim * 16)
    assert model.flops_per_token(16) - causal_flops_per_token(model, 16) == pytest.approx(
        6.0 * c.n_layer * c.n_head * c.head_dim * 16)


def test_the_loop_collects_every_so_many_steps(monkeypatch):
    from portachat.train import hot_path

    runs = []
    monkeypatch.setattr(hot_path.gc, "collect", lambda: runs.append(1))
    for step in range(1, 2 * hot_path.GC_COLLECT_EVERY + 1):
        hot_path.collect_garbage(step)
    hot_path.collect_garbage()
    assert len(runs) == 3
