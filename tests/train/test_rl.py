"""RL pieces on real parts: group advantages, tool-output masking, the policy-gradient direction,
and a short run through the engine that logs its reward curves."""

from __future__ import annotations

import json

import torch

from portachat.checkpoint import save_checkpoint, stage_dir
from portachat.data.synthetic.tasks import TASKS, task_examples
from portachat.device import get_device
from portachat.device.shapes import row_bucket
from portachat.model import GPT, GPTConfig
from portachat.tokenizer import render_for_completion
from portachat.train.collectives import SINGLE_PROCESS
from portachat.train.rl import (
    RLOptions,
    RolloutStats,
    group_advantages,
    informative_weights,
    probe_pass_rates,
    rl_tasks,
    rollout_batch,
    run_rl,
)
from portachat.train.rollout import Reply, tool_mask
from portachat.train.trainer import TrainConfig, token_loss


def logprob_of(model: GPT, prompt: list[int], reply: list[int]) -> float:
    """Sum of log p(reply | prompt) under `model` (for tests and diagnostics)."""
    ids = torch.tensor([prompt + reply])
    with torch.no_grad():
        nll = model(ids[:, :-1], ids[:, 1:].masked_fill(torch.arange(ids.shape[1] - 1) < len(prompt) - 1, -1),
                    loss_reduction="sum")
    return -float(nll)



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
    batch = rollout_batch([prompt], [Reply(reply, mask, "")], [0.5], tok.bos_id, max_len=96)
    targets = batch.targets[0].tolist()
    assert targets[: len(prompt) - 1] == [-1] * (len(prompt) - 1)  # the prompt is not trained on
    assert [t for t in targets if t >= 0] == [t for t, m in zip(reply, mask, strict=True) if m]
    assert batch.num_supervised() == sum(mask)
    assert torch.all(batch.weights == 0.5)


def test_rollout_rows_are_padded_to_the_devices_bucket():
    prompts = [[1] * 30, [1] * 70]
    replies = [Reply([2] * 5, [1] * 5, ""), Reply([2, 3], [1, 1], "")]  # the longest row: 72 tokens, 71 inputs
    eager_cpu, compiled = row_bucket("cpu", False), row_bucket("cuda", True)
    for bucket, max_len, width in ((eager_cpu, 512, 80), (compiled, 512, 128), (compiled, 100, 100),
                                   (compiled, 60, 71)):  # fine, coarse, capped at max_len, never cut below a row
        batch = rollout_batch(prompts, replies, [1.0, -1.0], pad_id=0, max_len=max_len, bucket=bucket)
        assert batch.inputs.shape == batch.targets.shape == batch.weights.shape == (2, width)
        assert batch.targets[1, 69:71].tolist() == [2, 3] and (batch.targets[1, 71:] == -1).all()
        assert batch.targets[0, 29:34].tolist() == [2] * 5 and batch.num_supervised() == 7
        assert batch.lengths == (34, 71)


def test_policy_gradient_moves_probability_toward_rewarded_replies(small_tokenizer):
    tok = small_tokenizer
    model = tiny_model(tok)
    prompt = render_for_completion(tok, [{"role": "user", "content": "Say yes"}])
    end = tok.special_ids["<|assistant_end|>"]
    good, bad = [*tok.encode("yes"), end], [*tok.encode("no way"), end]
    replies = [Reply(good, [1] * len(good), "yes"), Reply(bad, [1] * len(bad), "no way")]
    before = [logprob_of(model, prompt, r.token_ids) for r in replies]
    adv = group_advantages(torch.tensor([[1.0, 0.0]])).flatten().tolist()
    batch = rollout_batch([prompt, prompt], replies, adv, tok.bos_id, max_len=96)
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
        per_task = {k: v for k, v in r.items() if k.startswith("reward/")}
        assert per_task and set(per_task) <= {f"reward/{t}" for t in TASKS}
    meta = json.loads((result.final_checkpoint / "portachat.json").read_text())
    assert meta["stage"] == "rl" and meta["init_from"] == str(sft) and "heldout_accuracy" in meta["metrics"]
    # the untrained model solves nothing: the probe leaves every task at the floor, an even mix
    assert meta["task_weights"] == {t: opts.probe_floor for t in TASKS}
    # a resumed run keeps the mix it started with instead of probing the half-trained policy again
    said: list[str] = []
    more = RLOptions(num_samples=2, max_new_tokens=8, max_prompts=16, num_iterations=3, eval_examples=2,
                     resume="auto", train=TrainConfig(device_batch_size=4, eval_every=3, log_every=1))
    resumed = run_rl(more, dev=get_device("cpu", dtype="fp32", compile=False), print_fn=said.append)
    assert resumed.steps == 3 and not any("probed" in line for line in said)
    assert json.loads((resumed.final_checkpoint / "portachat.json").read_text())["task_weights"] == meta["task_weights"]


class ScriptedSampler:
    """Answers the probe's questions like a policy that has solved the tool tasks, gets every other
    comparison right, and fails the rest."""

    def __init__(self, tok, answers: dict[str, tuple[str, str]]) -> None:
        self.tok, self.answers, self.dev, self.comparisons = tok, answers, get_device("cpu"), 0

    def sample(self, prompts, max_tokens, temperature, seeds):
        replies = []
        for prompt in prompts:
            text = self.tok.decode(prompt)
            task, answer = next(v for q, v in self.answers.items() if q in text)
            if task == "comparison":
                self.comparisons += 1
            right = task in ("calc_arithmetic", "letter_count") or (task == "comparison" and self.comparisons % 2)
            reply = f"The answer is {answer if right else 'wrong'}."
            replies.append(Reply(self.tok.encode(reply), [1] * len(self.tok.encode(reply)), reply))
        return replies


def test_task_mix_follows_the_probed_pass_rates(small_tokenizer):
    per_task, seed = 16, 3
    answers = {ex.question: (ex.task, ex.answer) for name in TASKS
               for ex in task_examples(per_task, "train", f"rl-probe:{seed}", tasks=[name])}
    rates = probe_pass_rates(ScriptedSampler(small_tokenizer, answers), small_tokenizer, SINGLE_PROCESS, per_task, 16, 1.0, seed)
    assert rates == {"calc_arithmetic": 1.0, "mental_arithmetic": 0.0, "letter_count": 1.0, "comparison": 0.5,
                     "spelling": 0.0}
    weights = informative_weights(rates, floor=0.02)
    assert weights["comparison"] == 0.25  # p(1-p) at p = 1/2
    assert all(w == 0.02 for t, w in weights.items() if t != "comparison")  # solved or hopeless: the floor
    prompts, _, _ = rl_tasks(RLOptions(max_prompts=400, eval_examples=4), seed=0, weights=weights)
    share = sum(p["task"] == "comparison" for p in prompts) / len(prompts)
    assert 0.65 < share < 0.9  # 0.25 / (0.25 + 4 x 0.02) = 0.76


def test_rollout_stats_report_reward_per_task():
    stats = RolloutStats(get_device("cpu"), SINGLE_PROCESS, ["comparison", "spelling"])
    stats.add(torch.tensor([[1.0, 0.0], [1.0, 1.0]]), [3, 3, 3, 3], ["comparison", "spelling"])
    stats.add(torch.tensor([[0.0, 0.0]]), [2, 2], ["comparison"])
    out = stats.read()
    assert out["reward/comparison"] == 0.25 and out["reward/spelling"] == 1.0 and out["reward"] == 0.5
    stats.add(torch.tensor([[1.0, 1.0]]), [1, 1], ["spelling"])
    assert "reward/comparison" not in stats.read()  # a task this step did not sample has no entry
