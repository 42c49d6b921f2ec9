"""Mid-training and SFT in process: masked chat loss goes down, stages chain by their checkpoints."""

from __future__ import annotations

import json

import pytest
import torch

from portachat.checkpoint import CheckpointError, save_checkpoint, stage_dir
from portachat.data.chat_data import synthetic_heldout
from portachat.data.chat_loader import iter_chat_val_batches
from portachat.device import get_device
from portachat.eval.bpb import evaluate_bpb
from portachat.model import GPT, GPTConfig
from portachat.train.chat_stage import ChatOptions, run_chat_stage
from portachat.train.trainer import TrainConfig

SEQ = 96


def make_base(tokenizer, run: str = "default"):
    vocab = tokenizer.vocab_size + (-tokenizer.vocab_size % 64)
    cfg = GPTConfig(vocab_size=vocab, n_layer=1, n_embd=64, n_head=2, n_kv_head=2, head_dim=32,
                    intermediate_size=128, max_seq_len=SEQ)
    model = GPT(cfg)
    model.init_weights(seed=3)
    path = save_checkpoint(stage_dir(run, "base"), 5, model, tokenizer, {"stage": "base", "step": 5, "final": True})
    return model, path


def chat_options(stage: str, steps: int, **kw) -> ChatOptions:
    tc = TrainConfig(device_batch_size=4, num_iterations=steps, eval_every=steps, log_every=1, eval_tokens=4 * SEQ * 2)
    return ChatOptions(stage=stage, max_conversations=300, num_iterations=steps, eval_examples=4, eval_max_tokens=12,
                       train=tc, **kw)


def losses(stage_path) -> list[float]:
    recs = [json.loads(x) for x in (stage_path / "log.jsonl").read_text().splitlines()]
    return [r["loss"] for r in recs if "loss" in r]


def test_mid_then_sft_learn_from_the_previous_stage(small_tokenizer):
    dev = get_device("cpu", dtype="fp32", compile=False)
    base, base_path = make_base(small_tokenizer)
    mid = run_chat_stage(chat_options("mid", 16), dev=dev, print_fn=lambda _m: None)
    mid_path = stage_dir("default", "mid")
    meta = json.loads((mid.final_checkpoint / "portachat.json").read_text())
    assert meta["stage"] == "mid" and meta["init_from"] == str(base_path) and meta["pack"] is True
    loss = losses(mid_path)
    assert len(loss) == 16 and sum(loss[-3:]) / 3 < 0.7 * loss[0], loss

    # The stage started from the base weights: its step-0 validation equals the base model's.
    log = [json.loads(x) for x in (mid_path / "log.jsonl").read_text().splitlines()]
    step0 = next(r["val/bpb"] for r in log if r["step"] == 0 and "val/bpb" in r)
    val = synthetic_heldout(32)
    expected = evaluate_bpb(base, iter_chat_val_batches(val, small_tokenizer, 4, SEQ, max_batches=2),
                            small_tokenizer.token_bytes(), torch.device("cpu"), dev.autocast)
    assert step0 == pytest.approx(expected, rel=1e-5)
    # The final checkpoint carries the metrics measured at its own step.
    final_eval = [r for r in log if r["step"] == 16 and "val/bpb" in r][-1]
    assert meta["metrics"]["val_bpb"] == final_eval["val/bpb"]
    assert meta["metrics"]["heldout_accuracy"] == final_eval["eval/heldout_accuracy"]

    sft = run_chat_stage(chat_options("sft", 4), dev=dev, print_fn=lambda _m: None)
    sft_meta = json.loads((sft.final_checkpoint / "portachat.json").read_text())
    assert sft_meta["init_from"] == str(mid.final_checkpoint) and sft_meta["pack"] is False
    assert sft_meta["lr_scale"] == 0.1


def test_a_stage_without_its_previous_stage_says_what_to_run(small_tokenizer):
    with pytest.raises(CheckpointError, match="portachat train mid --run-name lonely"):
        run_chat_stage(ChatOptions(stage="sft", train=TrainConfig(run="lonely")), dev=get_device("cpu"))
