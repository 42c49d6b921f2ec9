"""Masked losses weigh every supervised token equally, however a step's rows are split."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.train.masked_grad import SUPERVISED, conversations, masked_gradients, tiny_model

REPO = Path(__file__).resolve().parents[2]


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and a
    for name in a:
        assert torch.allclose(a[name], b[name], atol=1e-5, rtol=0), (name, (a[name] - b[name]).abs().max().item())


def test_accumulation_split_gives_the_same_gradient(small_tokenizer, tmp_path):
    one_by_four = masked_gradients(4, small_tokenizer, tmp_path / "a")
    two_by_two = masked_gradients(2, small_tokenizer, tmp_path / "b")
    four_by_one = masked_gradients(1, small_tokenizer, tmp_path / "c")
    _assert_same(one_by_four, two_by_two)
    _assert_same(one_by_four, four_by_one)

    # Reference: the mean loss over all supervised tokens at once, by hand.
    model = tiny_model()
    batch = conversations()
    loss = model(batch.inputs, batch.targets, loss_reduction="sum") / sum(SUPERVISED)
    loss.backward()
    _assert_same(one_by_four, {n: p.grad for n, p in model.named_parameters() if p.grad is not None})

    # The test can fail: averaging per-micro-batch means (the naive split) gives another gradient.
    model.zero_grad()
    for i in (0, 2):
        (model(batch.inputs[i : i + 2], batch.targets[i : i + 2]) / 2).backward()
    naive = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert max((naive[n] - one_by_four[n]).abs().max().item() for n in naive) > 1e-3


@pytest.mark.slow
def test_two_processes_by_two_micro_batches_give_the_same_gradient(small_tokenizer, tmp_path):
    tok_dir = tmp_path / "tok"
    small_tokenizer.save(tok_dir)
    out = tmp_path / "grads.safetensors"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(REPO / "tests" / "train" / "masked_grad.py"), str(tok_dir), str(out)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    from safetensors.torch import load_file

    _assert_same(masked_gradients(4, small_tokenizer, tmp_path / "one"), load_file(str(out)))
