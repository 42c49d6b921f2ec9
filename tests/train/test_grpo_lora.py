"""GRPO with --lora-rank: only the adapter trains; the engine samples with the current adapter (its
values copied in place after each step, the base weights never reloaded); the KL's reference is the
same weights with the adapter switched off; `train rl --lora-rank 4` saves an adapter (and --merge a
plain model), on one process and on 2 torchrun workers (DDP)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch

from portachat.cli import build_parser, main
from portachat.data.batch import Batch
from portachat.device import get_device
from portachat.engine.oneshot import TokenIdsOnly
from portachat.engine.scoring import teacher_forced_logprobs
from portachat.model.load import load_for_inference
from portachat.model.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from portachat.train.grpo import run_grpo
from portachat.train.grpo_loss import GRPOLoss, token_logprobs
from portachat.train.lora import LoraOptions, adapters_disabled, add_lora, lora_from_flags
from portachat.train.rl import RLOptions
from portachat.train.rollout import POLICY, Rollout
from portachat.train.trainer import TrainingError
from tests.e2e.helpers import cli_env
from tests.train.test_grpo import tiny_task
from tests.train.test_rollout import model_logprobs, trainable_gpt

CPU = get_device("cpu", dtype="fp32", compile=False)


def lora_gpt():
    """(a tiny GPT with a rank-4 adapter on every linear layer, the same GPT without one)."""
    model = trainable_gpt()
    plain = copy.deepcopy(model).eval()
    return add_lora(model, LoraOptions(rank=4, alpha=8.0)), plain


def test_engine_samples_with_the_trained_adapter_without_a_reload():
    model, plain = lora_gpt()
    rollout = Rollout(model, TokenIdsOnly(96), CPU, max_num_seqs=4, max_model_len=64, lora=True)
    prompt = list(range(3, 23))
    rollout.sample_groups([prompt], 2, 6, 1.0, seed=0)
    engine = rollout.engine()
    assert engine.model is not model and not any(p.requires_grad for p in engine.model.parameters())
    adapter = engine.runner.lora.weights[engine.runner.lora.slot(POLICY)]
    addresses = [t.data_ptr() for layer in adapter for u in layer.values() for t in (u.A, u.B)]
    base_addresses = [p.data_ptr() for p in engine.model.parameters()]
    text = prompt + [5, 9, 11, 40]
    before = teacher_forced_logprobs(engine, [text], adapter=POLICY)[0]
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model(torch.tensor([text[:-1]]), torch.tensor([text[1:]])).backward()
    opt.step()
    rollout.sync()  # what every batch of rollouts starts with
    after = teacher_forced_logprobs(engine, [text], adapter=POLICY)[0]
    assert max(abs(a - b) for a, b in zip(after, before, strict=True)) > 1e-3  # the step moved the adapter
    torch.testing.assert_close(torch.tensor(after), torch.tensor(model_logprobs(model, text)), atol=1e-5, rtol=0)
    base = teacher_forced_logprobs(engine, [text])[0]  # rows without the adapter: the untouched base model
    torch.testing.assert_close(torch.tensor(base), torch.tensor(model_logprobs(plain, text)), atol=1e-5, rtol=0)
    assert [t.data_ptr() for layer in adapter for u in layer.values() for t in (u.A, u.B)] == addresses
    assert [p.data_ptr() for p in engine.model.parameters()] == base_addresses  # nothing reloaded
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        n for n, _p in model.named_parameters() if ".lora_" in n}


def test_kl_reference_is_the_base_model_with_the_adapter_off():
    model, plain = lora_gpt()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:  # a trained adapter: the policy differs from the base
                p.normal_(0, 0.05)
    ids = torch.randint(0, 96, (2, 17), generator=torch.Generator().manual_seed(0))
    targets = ids[:, 1:].clone()
    targets[:, :8] = -1  # the prompt
    batch = Batch(ids[:, :-1], targets, weights=torch.randn(2, 16, generator=torch.Generator().manual_seed(1)))
    with torch.no_grad(), adapters_disabled(model):
        torch.testing.assert_close(token_logprobs(model, batch), token_logprobs(plain, batch), atol=1e-6, rtol=0)
    assert (token_logprobs(model, batch) - token_logprobs(plain, batch)).abs().max() > 1e-3
    shared = GRPOLoss(beta=0.1, reference=model, reference_is_base=True)(model, batch)
    copied = GRPOLoss(beta=0.1, reference=plain)(model, batch)
    torch.testing.assert_close(shared, copied, atol=1e-5, rtol=1e-6)
    shared.backward()  # the adapter is trainable again after the reference's forward
    assert all(p.grad is not None for n, p in model.named_parameters() if ".lora_" in n)
    assert all(p.grad is None for n, p in model.named_parameters() if ".lora_" not in n)


def test_train_rl_with_lora_rank_saves_an_adapter_and_merges(tmp_path, monkeypatch):
    base, data, reward = tiny_task(tmp_path)
    home = tmp_path / "home"
    monkeypatch.setenv("PORTACHAT_HOME", str(home))
    code = main(["train", "rl", "--init", str(base), "--data", str(data), "--reward", reward, "--lora-rank", "4",
                 "--merge", "--beta", "0.04", "--device", "cpu", "--dtype", "fp32", "--compile", "0",
                 "--num-samples", "2", "--device-batch-size", "4", "--max-new-tokens", "4", "--num-iterations", "1",
                 "--eval-every", "0", "--eval-examples", "0", "--run-name", "lora"])
    assert code == 0
    stage = home / "runs" / "lora" / "rl"
    step = stage / "step_000001"
    assert (step / ADAPTER_CONFIG).is_file() and (step / ADAPTER_WEIGHTS).is_file()
    meta = json.loads((step / "portachat.json").read_text())
    assert meta["finetune"] == "lora" and meta["lora"]["rank"] == 4 and meta["grpo"]["beta"] == 0.04
    merged = load_for_inference(stage / "merged", device="cpu", dtype=torch.float32).model
    assert merged.config.vocab_size == 320


def test_lora_flags_reach_the_options_and_merge_needs_an_adapter():
    args = build_parser().parse_args(["train", "rl", "--init", "m", "--data", "p.jsonl", "--reward", "gsm8k",
                                      "--lora-rank", "8", "--lora-targets", "q_proj,v_proj", "--merge"])
    assert lora_from_flags(args.lora_rank, args.lora_alpha, args.lora_targets, args.lora_dropout) == LoraOptions(
        rank=8, alpha=16.0, targets=["q_proj", "v_proj"], dropout=0.0)
    assert lora_from_flags(None, None, "q_proj", 0.0) is None
    with pytest.raises(TrainingError, match="--lora-targets"):
        lora_from_flags(4, None, "q_proj,lm_head", 0.0)
    with pytest.raises(TrainingError, match="--merge folds a LoRA adapter"):
        run_grpo(RLOptions(init="m", data=["p.jsonl"], rewards=["gsm8k"], merge=True), dev=CPU)


@pytest.mark.slow
def test_torchrun_two_gloo_workers_train_one_adapter(tmp_path):
    """DDP: both ranks sample with their synced adapter, the KL reference is each rank's base, and rank 0
    saves the adapter and the merged model."""
    base, data, reward = tiny_task(tmp_path)
    home = tmp_path / "home"
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "-m", "portachat", "train", "rl", "--init", str(base), "--data", str(data), "--reward",
                          reward, "--device", "cpu", "--dtype", "fp32", "--compile", "0", "--lora-rank", "4",
                          "--beta", "0.04", "--merge", "--num-samples", "2", "--device-batch-size", "4",
                          "--max-new-tokens", "6", "--num-iterations", "2", "--lr", "5e-2", "--eval-every", "0",
                          "--eval-examples", "0", "--log-every", "1", "--run-name", "ddp"],
                         env=cli_env(home, threads=1), capture_output=True, text=True, timeout=600, cwd=os.getcwd())
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    stage = home / "runs" / "ddp" / "rl"
    meta = json.loads((stage / "step_000002" / "portachat.json").read_text())
    assert meta["parallel"] == "ddp" and meta["world_size"] == 2 and meta["finetune"] == "lora"
    assert (stage / "step_000002" / ADAPTER_WEIGHTS).is_file()
    before = load_for_inference(base, device="cpu", dtype=torch.float32).model.state_dict()
    after = load_for_inference(stage / "merged", device="cpu", dtype=torch.float32).model.state_dict()
    assert any(not torch.allclose(after[k], before[k]) for k in after)  # the trained adapter, folded in
