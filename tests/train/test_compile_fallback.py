"""A compiler that fails at the first step costs the speed-up, not the run: training goes on eagerly."""

from __future__ import annotations

import json

import pytest
import torch
from test_trainer import _setup

from portachat.device import dist_env, get_device
from portachat.tokenizer import train_tokenizer
from portachat.train.compile_fallback import CompileFallback
from portachat.train.trainer import train


@pytest.fixture(scope="module")
def small_tokenizer():
    """A tokenizer from text made here (the trainer's tests use Shakespeare; this one needs only a vocabulary)."""
    words = ("the", "model", "trains", "on", "any", "device", "eagerly", "when", "compiling", "fails")
    lines = [" ".join(words[(i * j) % len(words)] for j in range(1, 9)) for i in range(400)]
    return train_tokenizer(lines, vocab_size=384)


def _broken_backend(gm, example_inputs):
    raise RuntimeError("triton: no code generator for gfx928")  # what an unsupported Triton does


def _losses(run_dir) -> list[float]:
    return [r["loss"] for r in map(json.loads, (run_dir / "log.jsonl").read_text().splitlines()) if "loss" in r]


def test_first_step_compile_failure_trains_on_eagerly_with_the_same_loss(small_tokenizer, tmp_path, monkeypatch):
    model, data, tc = _setup(small_tokenizer, steps=3)
    train(model, small_tokenizer, data, tc, get_device("cpu", compile=False), dist_env(), tmp_path / "eager",
          print_fn=lambda _: None)
    dev = get_device("cpu", compile=True)  # the policy chose to compile; the compiler then fails
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: real_compile(model, backend=_broken_backend))
    model, data, tc = _setup(small_tokenizer, steps=3)
    lines: list[str] = []
    train(model, small_tokenizer, data, tc, dev, dist_env(), tmp_path / "fallback", print_fn=lines.append)
    said = [x for x in lines if "torch.compile failed" in x]
    assert len(said) == 1 and "no code generator for gfx928" in said[0] and "PORTACHAT_COMPILE=0" in said[0]
    eager, fallback = _losses(tmp_path / "eager"), _losses(tmp_path / "fallback")
    assert len(fallback) == 3
    torch.testing.assert_close(fallback, eager, rtol=0, atol=0)


def test_a_working_compile_stays_compiled_and_later_errors_are_raised():
    calls = []

    def recording_backend(gm, example_inputs):
        calls.append(len(example_inputs))
        return gm.forward  # runs the traced graph as it is

    said: list[str] = []
    net = torch.nn.Linear(4, 2)
    wrapped = CompileFallback(net, recording_backend, said.append)
    x = torch.randn(3, 4)
    torch.testing.assert_close(wrapped(x), net(x))
    assert calls and wrapped.failed is None and not said
    with pytest.raises(Exception, match="shape|size|mat"):  # the model's own error, not the compiler's
        wrapped(torch.randn(3, 5))
    assert wrapped.failed is None and not said
