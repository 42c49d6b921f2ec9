"""RL pieces on real parts: group advantages, tool-output masking, the policy-gradient direction,
and a short run through the engine that logs its reward curves."""

from __future__ import annotations

import json

import torch

from portachat.checkpoint import save_checkpoint, stage_dir
from portachat.device import get_device
from portachat.model import GPT, GPTConfig
from portachat.tokenizer import render_for_completion
from portachat.train.rl import RLOptions, group_advantages, logprob_of, rollout_batch, run_rl
from portachat.train.rollout import Reply, tool_mask
from portachat.train.trainer import TrainConfig, token_loss


def tiny_model(tok, seq: int = 96) -> GPT:
    vocab = tok.vocab_size + (-tok.vocab_size % 64)
    model = GPT(GPTConfig(vocab_size=vocab, n_layer=1, n_embd=64, n_head=2, n_kv_head=2, head_dim=32,
                          intermediate_size=128, max_seq_len=seq))
    model.init_weights(seed=5)
    return model


def test_group_advantages():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    assert group_advantages(rewards).tolist() == [[0.5, -0.5, -0.5, 0.5], [0.0, 0.0, 0.0, 0.0]]
    normed = group_advantages(rewards, normalize_std=True)
    assert torch.allclose(normed[0], torch.tensor([0.866, -0.866, -0.866, 0.866]), atol=1e-3)
    assert normed[1].abs().max() == 0  # a group that all agree teaches nothing


def test_tool_outputs_are_never_targets(small_tokenizer):
    tok, s = small_tokenizer, small_tokenizer.special_ids
    reply = [*tok.encode("Use it "), s["<|python_start|>"], *tok.encode("12*34"), s["<|python_end|>"],
             s["<|output_start|>"], *tok.encode("408"), s["<|output_end|>"], *tok.encode(" so 408."),
             s["<|assistant_end|>"]]
    mask = tool_mask(tok, reply)
    forced = [t for t, m in zip(reply, mask, strict=True) if m == 0]
    assert forced == [s["<|output_start|>"], *tok.encode("408"), s["<|output_end|>"]]
    # An output the calculator would refuse was not forced by the engine: the model wrote it, it is a target.
    bogus = [s["<|python_start|>"], *tok.encode("import os"), s["<|python_end|>"], s["<|output_start|>"], 7]
    assert tool_mask(tok, bogus) == [1] * len(bogus)

    prompt = render_for_completion(tok, [{"role": "user", "content": "What is 12*34?"}])
    batch = rollout_batch([prompt], [Reply(reply, mask, "")], [0.5], tok.bos_id)
    targets = batch.targets[0].tolist()
    assert targets[: len(prompt) - 1] == [-1] * (len(prompt) - 1)  # the prompt is not trained on
    assert [t for t in targets if t >= 0] == [t for t, m in zip(reply, mask, strict=True) if m]
    assert batch.num_supervised() == sum(mask)
    assert torch.all(batch.weights == 0.5)


def test_policy_gradient_moves_probability_toward_rewarded_replies(small_tokenizer):
    tok = small_tokenizer
    model = tiny_model(tok)
    prompt = render_for_completion(tok, [{"role": "user", "content": "Say yes"}])
    end = tok.special_ids["<|assistant_end|>"]
    good, bad = [*tok.encode("yes"), end], [*tok.encode("no way"), end]
    replies = [Reply(good, [1] * len(good), "yes"), Reply(bad, [1] * len(bad), "no way")]
    before = [logprob_of(model, prompt, r.token_ids) for r in replies]
    adv = group_advantages(torch.tensor([[1.0, 0.0]])).flatten().tolist()
    batch = rollout_batch([prompt, prompt], replies, adv, tok.bos_id)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(3):
        opt.zero_grad()
        (token_loss(model, batch) / batch.num_supervised()).backward()
        opt.step()
    after = [logprob_of(model, prompt, r.token_ids) for r in replies]
    assert after[0] > before[0] + 0.1 and after[1] < before[1] - 0.1, (before, after)


def test_rl_run_logs_reward_curves_and_checkpoints(small_tokenizer):
    model = tiny_model(small_tokenizer)
    sft = save_checkpoint(stage_dir("default", "sft"), 3, model, small_tokenizer, {"stage": "sft", "step": 3})
    opts = RLOptions(num_samples=2, max_new_tokens=8, max_prompts=16, num_iterations=2, eval_examples=2,
                     train=TrainConfig(device_batch_size=4, eval_every=2, log_every=1))
    result = run_rl(opts, dev=get_device("cpu", dtype="fp32", compile=False), print_fn=lambda _m: None)
    assert result.steps == 2
    log = [json.loads(x) for x in (stage_dir("default", "rl") / "log.jsonl").read_text().splitlines()]
    steps = [r for r in log if "loss" in r]
    assert len(steps) == 2
    for r in steps:
        assert 0.0 <= r["reward"] <= 1.0 and 0.0 <= r["pass_at_k"] <= 1.0
        assert 0 < r["response_length"] <= 8 and r["supervised_tokens"] > 0
    meta = json.loads((result.final_checkpoint / "portachat.json").read_text())
    assert meta["stage"] == "rl" and meta["init_from"] == str(sft) and "heldout_accuracy" in meta["metrics"]
