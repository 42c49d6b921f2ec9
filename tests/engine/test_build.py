"""The one engine builder: the server (and `chat`, `generate`), eval, RL rollouts and training samples
all get their engine from portachat.engine.build, and no other product module constructs one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import portachat
from portachat.device import get_device
from portachat.engine import build
from portachat.engine.loading import LoadOptions, load_served_model
from portachat.engine.runner import ModelRunner
from portachat.eval.run import EvalOptions, run_evals
from portachat.model import GPT, GPTConfig
from portachat.model.model_dir import save_model_files
from portachat.train.rollout import Rollout
from portachat.train.samples import greedy_samples


@pytest.fixture(scope="module")
def model(small_tokenizer) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=small_tokenizer.vocab_size, n_layer=1, n_embd=64, n_head=4, n_kv_head=2,
                    head_dim=16, intermediate_size=128, max_seq_len=64)
    return GPT(cfg)


@pytest.fixture
def built(monkeypatch) -> list:
    """Every engine build_engine makes, with the runner class it chose."""
    made = []
    real = build.LLMEngine

    def counting(*args, **kwargs):
        engine = real(*args, **kwargs)
        made.append(type(engine.runner))
        return engine

    monkeypatch.setattr(build, "LLMEngine", counting)
    return made


def test_server_eval_rollouts_and_samples_build_through_the_one_builder(built, model, small_tokenizer, tmp_path):
    path = tmp_path / "step_000001"
    path.mkdir()
    save_model_files(path, model, small_tokenizer, {"stage": "sft", "step": 1})

    served = load_served_model(LoadOptions(model=str(path), device="cpu", dtype="fp32", max_num_seqs=2))
    assert built == [ModelRunner] and served.engine.runner.__class__ is ModelRunner  # serve, chat, generate

    results = run_evals(EvalOptions(task="synthetic", model=str(path), limit=1, max_tokens=2, device="cpu"),
                        log=lambda line: None)
    assert results[0].n == 1 and len(built) == 2

    training = GPT(model.config)
    training.load_state_dict(model.state_dict())
    training.train()
    dev = get_device("cpu")
    replies = Rollout(training, small_tokenizer, dev, max_num_seqs=2).sample([[small_tokenizer.bos_id]], 2, 0.0,
                                                                                   [0])
    assert len(replies) == 1 and len(built) == 3 and training.training

    assert len(greedy_samples(training, small_tokenizer, ["the"], 2, dev)) == 1 and len(built) == 4


def test_no_other_product_module_constructs_an_engine():
    root = Path(portachat.__file__).parent
    callers = []
    for file in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            func = node.func if isinstance(node, ast.Call) else None
            name = getattr(func, "id", None) or getattr(func, "attr", None)
            if name == "LLMEngine":
                callers.append(str(file.relative_to(root)))
    assert callers == ["engine/build.py"]


def test_the_runner_does_not_import_the_workers():
    runner = Path(portachat.__file__).parent / "engine" / "runner.py"
    imported = [n.module for n in ast.walk(ast.parse(runner.read_text(encoding="utf-8")))
                if isinstance(n, ast.ImportFrom) and n.module]
    assert imported and not any(m.startswith("portachat.engine.workers") for m in imported)
