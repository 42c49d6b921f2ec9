"""Fine-tuning's answer-accuracy evaluation runs the engine on a copy in the device's inference dtype
(an accelerator's decision simulated on the CPU), never on the master weights it is training."""

from __future__ import annotations

import json

import torch

from portachat.device import get_device
from portachat.engine import engine as engine_mod
from portachat.train import engine_copy
from portachat.train.finetune import FinetuneOptions, run_finetune
from portachat.train.trainer import TrainConfig
from tests.model.hf_families import make_hf_dir


def test_answer_accuracy_runs_on_a_bf16_copy(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_copy, "training_engine_dtype", lambda dev: torch.bfloat16)
    engines = []
    real_init = engine_mod.LLMEngine.__init__

    def recording_init(self, model, *args, **kwargs):
        engines.append({p.dtype for p in model.parameters()} | {any(p.requires_grad for p in model.parameters())})
        real_init(self, model, *args, **kwargs)

    monkeypatch.setattr(engine_mod.LLMEngine, "__init__", recording_init)
    base = tmp_path / "base"
    make_hf_dir(base, "qwen2", seed=2)
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"what is {i} + 1?"},
                                                     {"role": "assistant", "content": f"The answer is {i + 1}."}],
                                        "answer": str(i + 1)}) + "\n" for i in range(16)))
    opts = FinetuneOptions(
        init=str(base), data=[str(data)], num_iterations=2, max_seq_len=48, eval_examples=2, eval_max_tokens=4,
        lr=3e-3, train=TrainConfig(run="copy", runs_root=str(tmp_path / "runs"), device_batch_size=2, eval_every=2,
                                   log_every=1, sample_every=0))
    result = run_finetune(opts, dev=get_device("cpu", dtype="fp32", compile=False), print_fn=lambda _m: None)
    assert engines and all(e == {torch.bfloat16, False} for e in engines)
    records = [json.loads(line) for line in (result.final_checkpoint.parent / "log.jsonl").read_text().splitlines()]
    assert any("eval/answer_accuracy" in r for r in records)
