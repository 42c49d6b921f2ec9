"""A LoRA run resumes exactly, its fp16 loss scaler included: the adapter checkpoint goes through the one
checkpoint writer (GradScaler state saved), and resume restores what was saved."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from portachat.checkpoint.trainer_state import STATE_DIR
from portachat.device import get_device, reset_device_cache
from portachat.model.lora import ADAPTER_WEIGHTS
from portachat.train.finetune import FinetuneOptions, run_finetune
from portachat.train.lora import LoraOptions
from portachat.train.trainer import TrainConfig, Trainer
from tests.model.hf_families import make_hf_dir
from tests.train.test_lora import write_conversations


def test_fp16_lora_resume_keeps_the_grad_scaler(tmp_path, monkeypatch):
    monkeypatch.delenv("PORTACHAT_DTYPE", raising=False)
    reset_device_cache()
    dev = get_device("cpu", dtype="fp16", compile=False)
    if dev.grad_scaler() is None:
        pytest.skip("this torch has no GradScaler for the CPU")
    base = tmp_path / "base"
    make_hf_dir(base, "llama", seed=3)
    data = write_conversations(tmp_path / "chat.jsonl")
    saved: dict[int, dict] = {}  # the live scaler's state at each save
    started: list[dict] = []  # the scaler's state when training (re)starts
    real_save, real_fit = Trainer.save, Trainer.fit

    def save(self, step, final):
        saved[step] = self.scaler.state_dict()
        return real_save(self, step, final)

    def fit(self):
        started.append(self.scaler.state_dict())
        return real_fit(self)

    monkeypatch.setattr(Trainer, "save", save)
    monkeypatch.setattr(Trainer, "fit", fit)

    def run(name: str, resume: str | None = None):
        opts = FinetuneOptions(init=str(base), data=[str(data)], num_iterations=4, max_seq_len=32, eval_examples=0,
                               lr=1e-3, resume=resume, lora=LoraOptions(rank=4, alpha=8, targets=["q_proj", "v_proj"]),
                               train=TrainConfig(run=name, runs_root=str(tmp_path / "runs"), device_batch_size=2,
                                                 eval_every=0, save_every=2, keep_last=0))
        return run_finetune(opts, dev=dev, print_fn=lambda _m: None).final_checkpoint

    straight = run("straight")
    step2 = straight.parent / "step_000002"
    on_disk = json.loads((step2 / STATE_DIR / "optimizer.json").read_text())["grad_scaler"]
    assert on_disk is not None and on_disk == saved[2]
    assert saved[2]["_growth_tracker"] != 0 or saved[2]["scale"] != 65536.0  # not a fresh scaler's state
    resumed = run("resumed", resume=str(step2))
    assert started[-1] == saved[2]  # restored equal to what was saved
    a, b = (load_file(str(d / ADAPTER_WEIGHTS)) for d in (straight, resumed))
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
