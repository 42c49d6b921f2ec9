"""RL on verifiable rewards: on-policy policy gradient with group-relative advantages (GRPO-style).

Each micro-batch takes a few prompts, samples G replies per prompt through the inference engine
(calculator tool on) from the current weights, and scores each with the task's verifier (1 right,
0 wrong). A reply's advantage is its reward minus its group's mean (optionally over the group's
std). The loss is -sum(advantage * log p(token)) over the tokens the model sampled: prompt tokens,
padding and the tool's forced output tokens are masked out. The Trainer divides by the global
number of sampled tokens. Rewards (overall and per task), pass@G and reply lengths are logged every step.

On the synthetic tasks, RL first measures each task's pass rate p on a few sampled replies and draws
its prompts in proportion to p(1-p): a task the SFT model always (or never) solves gives groups whose
replies all agree, which carry no advantage, so practising it only spends rollouts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch

from portachat.data.batch import Batch
from portachat.data.chat_data import (
    Conversation,
    load_conversations,
    synthetic_conversations,
    synthetic_heldout,
)
from portachat.data.chat_loader import Bucket
from portachat.data.synthetic.tasks import TASKS, task_examples
from portachat.device import Device, DistEnv
from portachat.device.shapes import pad_bucket, row_bucket
from portachat.i18n import _
from portachat.model.model_dir import read_meta
from portachat.tokenizer import Tokenizer, render_for_completion
from portachat.train.chat_eval import answer_accuracy_evaluator, is_correct
from portachat.train.chat_stage import model_from_checkpoint
from portachat.train.collectives import sum_over_ranks
from portachat.train.grpo_loss import group_advantages
from portachat.train.rl_options import RLOptions
from portachat.train.rollout import Reply, Rollout
from portachat.train.stage import begin_stage
from portachat.train.trainer import Stage, TrainingError, TrainResult, load_init_weights, train


def rollout_batch(prompts: Sequence[list[int]], replies: Sequence[Reply], advantages: Sequence[float], pad_id: int,
                  max_len: int, bucket: Bucket = pad_bucket) -> Batch:
    """Rows of prompt + reply; only the model-sampled reply tokens are targets, weighted by their advantage.
    Rows are padded to the device's bucket (`bucket(longest row's inputs, max_len)`, device/shapes.py, as
    the chat loaders' batches are), so a compiled model sees the few shapes the device was tuned for."""
    rows = [list(p) + r.token_ids for p, r in zip(prompts, replies, strict=True)]
    longest = max(1, max(len(r) for r in rows) - 1)  # input positions: a row's last token is only a target
    width = max(longest, bucket(longest, max_len))  # a row is never cut, even one past max_len
    inputs = torch.full((len(rows), width), pad_id, dtype=torch.long)
    targets = torch.full((len(rows), width), -1, dtype=torch.long)
    weights = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, (prompt, reply, adv) in enumerate(zip(prompts, replies, advantages, strict=True)):
        row = rows[i]
        inputs[i, : len(row) - 1] = torch.tensor(row[:-1], dtype=torch.long)
        for j, (token, sampled) in enumerate(zip(reply.token_ids, reply.mask, strict=True)):
            if sampled:
                targets[i, len(prompt) + j - 1] = token  # position t predicts token t + 1
        weights[i] = float(adv)
    return Batch(inputs, targets, weights, lengths=tuple(len(row) - 1 for row in rows))


class RolloutStats:
    """Per-step rollout metrics, summed over micro-batches and ranks when read; `tasks` (the task names
    prompts may carry) get their own mean reward, `reward/<task>`, in steps that sampled them."""

    def __init__(self, dev: Device, env: DistEnv, tasks: Sequence[str] = ()) -> None:
        self.dev, self.env = dev, env
        self.tasks = list(tasks)  # a fixed order, so every rank reduces the same vector
        self.reset()

    def reset(self) -> None:
        # reward, replies, groups solved, groups, reply tokens, then (reward, replies) per task
        self.sums = [0.0] * (5 + 2 * len(self.tasks))

    def add(self, rewards: torch.Tensor, lengths: list[int], tasks: Sequence[str | None] = ()) -> None:
        """rewards [groups, G]; tasks: each group's task name (None or unknown: counted in the totals only)."""
        self.sums[0] += rewards.sum().item()
        self.sums[1] += rewards.numel()
        self.sums[2] += (rewards.max(dim=1).values > 0).sum().item()
        self.sums[3] += rewards.shape[0]
        self.sums[4] += sum(lengths)
        for g, task in enumerate(tasks):
            if task in self.tasks:
                k = 5 + 2 * self.tasks.index(task)
                self.sums[k] += rewards[g].sum().item()
                self.sums[k + 1] += rewards.shape[1]

    def read(self) -> dict[str, float]:
        totals = torch.tensor(self.sums, dtype=self.dev.accumulate_dtype, device=self.dev.torch_device)
        values = sum_over_ranks(totals, self.env).tolist()
        reward, replies, solved, groups, tokens = values[:5]
        self.reset()
        out = {"reward": reward / max(replies, 1), "pass_at_k": solved / max(groups, 1),
               "response_length": tokens / max(replies, 1)}
        for i, task in enumerate(self.tasks):
            if values[6 + 2 * i] > 0:
                out[f"reward/{task}"] = values[5 + 2 * i] / values[6 + 2 * i]
        return out


class RolloutStream:
    """Stream s of n: prompts s, s+n, ... of the task list; each batch = prompts_per_batch x G rollouts."""

    def __init__(self, tasks: list[Conversation], tokenizer: Tokenizer, sampler: Rollout, stats: RolloutStats,
                 opts: RLOptions, prompts_per_batch: int, stream: int, num_streams: int, seed: int, max_len: int,
                 bucket: Bucket = pad_bucket) -> None:  # fmt: skip
        self.tasks, self.tokenizer, self.sampler, self.stats, self.opts = tasks, tokenizer, sampler, stats, opts
        self.prompts_per_batch, self.seed, self.max_len, self.bucket = prompts_per_batch, seed, max_len, bucket
        self.mine = list(range(stream % len(tasks), len(tasks), num_streams)) or [stream % len(tasks)]
        self.stream = stream
        self.index = 0  # prompts read so far (wraps around the share)

    def next_batch(self) -> Batch:
        """prompts_per_batch groups of G replies. A group whose replies all scored the same carries no
        signal (every advantage is 0), so up to `opts.sample_rounds` rounds of fresh prompts are drawn to
        fill the batch with informative groups first (DAPO's dynamic sampling); uninformative groups
        fill whatever is left. Without it a nearly solved task set leaves a few noisy groups to drive
        every update, and Muon's normalised steps then move the weights by noise."""
        G = self.opts.num_samples
        informative: list[tuple[list[list[int]], list[Reply], list[float]]] = []
        flat: list[tuple[list[list[int]], list[Reply], list[float]]] = []
        for _round in range(max(1, self.opts.sample_rounds)):
            picked = [self.tasks[self.mine[(self.index + k) % len(self.mine)]] for k in range(self.prompts_per_batch)]
            prompts = [render_for_completion(self.tokenizer, t["messages"]) for t in picked for _ in range(G)]
            base = (self.seed * 1_000_003 + self.stream * 7919 + self.index) * 64
            replies = self.sampler.sample(prompts, self.opts.max_new_tokens, self.opts.temperature,
                                          seeds=[base + k for k in range(len(prompts))])
            self.index += self.prompts_per_batch
            rewards = torch.tensor([[float(is_correct(replies[g * G + k].text, t["answer"])) for k in range(G)]
                                    for g, t in enumerate(picked)])
            self.stats.add(rewards, [sum(r.mask) for r in replies], [t.get("task") for t in picked])
            adv = group_advantages(rewards, self.opts.normalize_std)
            for g in range(len(picked)):
                group = (prompts[g * G : (g + 1) * G], replies[g * G : (g + 1) * G], adv[g].tolist())
                (informative if rewards[g].max() > rewards[g].min() else flat).append(group)
            if len(informative) >= self.prompts_per_batch:
                break
        chosen = (informative + flat)[: self.prompts_per_batch]
        self.sampler.sleep()  # the KV cache's memory is the trainer's until the next batch
        return rollout_batch([p for c in chosen for p in c[0]], [r for c in chosen for r in c[1]],
                             [a for c in chosen for a in c[2]], self.tokenizer.bos_id, self.max_len, self.bucket)

    def state_dict(self) -> dict:
        return {"index": self.index, "count": len(self.tasks)}

    def load_state_dict(self, state: dict) -> None:
        if state.get("count") == len(self.tasks):
            self.index = int(state["index"])


def probe_pass_rates(sampler: Rollout, tokenizer: Tokenizer, env: DistEnv, per_task: int,
                     max_new_tokens: int, temperature: float, seed: int) -> dict[str, float]:
    """Each synthetic task's pass rate under the current policy: one sampled reply to each of `per_task`
    fresh train-split questions per task (each rank answers its share; the counts are summed)."""
    rank, world = env.rank, env.world_size
    names = list(TASKS)
    examples = [ex for name in names for ex in task_examples(per_task, "train", f"rl-probe:{seed}", tasks=[name])]
    mine = list(range(rank, len(examples), world))
    prompts = [render_for_completion(tokenizer, examples[i].prompt) for i in mine]
    replies = sampler.sample(prompts, max_new_tokens, temperature, seeds=[seed * 1_000_003 + i for i in mine])
    counts = torch.zeros(len(names), 2, dtype=torch.int64)  # (right, answered): exact in any backend
    for i, reply in zip(mine, replies, strict=True):
        ex = examples[i]
        counts[names.index(ex.task)] += torch.tensor([int(is_correct(reply.text, ex.answer)), 1])
    counts = sum_over_ranks(counts.to(sampler.dev.torch_device), env).cpu()
    return {name: float(counts[k, 0] / max(float(counts[k, 1]), 1.0)) for k, name in enumerate(names)}


def informative_weights(pass_rates: dict[str, float], floor: float) -> dict[str, float]:
    """Task weights for RL: p(1-p), the variance of one reply's reward, is 0 for a task the policy always
    or never solves (all its groups agree and teach nothing) and largest at p = 1/2; the floor keeps
    every task in the mix so the others are still rehearsed."""
    return {task: max(p * (1.0 - p), floor) for task, p in pass_rates.items()}


def rl_tasks(opts: RLOptions, seed: int, weights: dict[str, float] | None = None,
             ) -> tuple[list[Conversation], list[Conversation], str]:
    """(training prompts, held-out prompts, description); every row carries the answer its verifier checks.
    `weights`: the synthetic tasks' mix (None = the curriculum's default)."""
    if opts.data:
        rows = [c for c in load_conversations(opts.data, limit=opts.max_prompts) if c.get("answer") is not None]
        if not rows:
            raise TrainingError(_("--data {data}: no rows with a verifiable answer (GSM8K 'question'/'answer', "
                                  "multiple choice, or 'messages' rows with an 'answer' field)").format(
                data=", ".join(opts.data)))
        n_val = min(200, len(rows) // 10) if len(rows) >= 10 else 0
        return rows[: len(rows) - n_val] or rows, rows[len(rows) - n_val :] or rows[:1], ", ".join(opts.data)
    n = opts.max_prompts or 2000
    return (synthetic_conversations(n, "train", f"rl:{seed}", weights), synthetic_heldout(max(opts.eval_examples, 1)),
            f"synthetic tasks ({n} prompts)")


def synthetic_task_mix(opts: RLOptions, sampler: Rollout, tokenizer: Tokenizer, env: DistEnv, seed: int,
                       init_from: Path | None, resume_from: Path | None, say) -> dict[str, float] | None:
    """The synthetic tasks' weights for this run (announced): given, probed, or None (the default mix).
    A resumed run keeps the mix it started with (its prompt list must not change under it)."""
    if resume_from is not None:
        return read_meta(resume_from).get("task_weights")
    if opts.task_weights:
        say("[portachat] " + _("rl: task mix as given: {mix}").format(mix=_fmt_mix(opts.task_weights)))
        return dict(opts.task_weights)
    if opts.probe_examples <= 0 or init_from is None:
        return None
    load_init_weights(sampler.model, tokenizer, init_from)  # the Trainer loads them again; the probe needs them now
    rates = probe_pass_rates(sampler, tokenizer, env, opts.probe_examples, opts.max_new_tokens, opts.temperature, seed)
    weights = informative_weights(rates, opts.probe_floor)
    say("[portachat] " + _("rl: probed pass rates ({n} sampled replies per task): {rates}").format(
        n=opts.probe_examples, rates=_fmt_mix(rates)))
    total = sum(weights.values())
    say("[portachat] " + _("rl: task mix, weighted by p(1-p): {mix}").format(
        mix=_fmt_mix({t: w / total for t, w in weights.items()})))
    return weights


def _fmt_mix(values: dict[str, float]) -> str:
    return ", ".join(f"{task} {value:.2f}" for task, value in values.items())


def run_rl(opts: RLOptions, dev: Device | None = None, print_fn=print) -> TrainResult:
    """RL from the run's SFT checkpoint (or --init); returns the final checkpoint."""
    cfg = opts.train
    if opts.num_samples < 2:
        raise TrainingError(_("--num-samples must be at least 2: advantages compare replies within a group"))
    if cfg.device_batch_size % opts.num_samples:
        raise TrainingError(_("--device-batch-size {batch} must be a multiple of --num-samples {samples} (each row "
                              "is one reply; a prompt's G replies share a micro-batch)").format(
            batch=cfg.device_batch_size, samples=opts.num_samples))
    start = begin_stage("rl", cfg, dev, print_fn, resume=opts.resume, overwrite=opts.overwrite, init=opts.init,
                        from_previous=True)
    dev, env, say, cfg, path = start.dev, start.env, start.say, start.cfg, start.path
    resume_from, init_from = start.resume_from, start.init_from
    model, tokenizer = model_from_checkpoint(resume_from or init_from, dev)
    cfg = replace(cfg, max_seq_len=model.config.max_seq_len, muon_momentum_warmup=0,
                  warmdown_ratio=opts.warmdown_ratio, optim=cfg.optim.scaled(opts.lr_scale))
    sampler = Rollout(model, tokenizer, dev, max_num_seqs=max(cfg.device_batch_size, 1))
    weights = None if opts.data else synthetic_task_mix(opts, sampler, tokenizer, env, cfg.seed, init_from,
                                                         resume_from, say)
    tasks, heldout, described = rl_tasks(opts, cfg.seed, weights)
    prompts_per_batch = cfg.device_batch_size // opts.num_samples
    streams = env.world_size * cfg.grad_accum_steps(env.world_size)
    cfg = replace(cfg, num_iterations=opts.num_iterations if opts.num_iterations is not None
                  else max(1, math.ceil(opts.num_epochs * len(tasks) / (prompts_per_batch * streams))))
    say(f"[portachat] {cfg.stage}: " + _("{n} prompts from {source}, {samples} samples each, {per_step} prompts per step; "
                               "starting from {path}").format(
        n=len(tasks), source=described, samples=opts.num_samples, per_step=prompts_per_batch * streams,
        path=init_from or resume_from))
    if not opts.data:
        say("[portachat] " + _("NOTE: no --data given: RL on the built-in SYNTHETIC tasks (offline)."))

    stats = RolloutStats(dev, env, sorted({t["task"] for t in tasks if t.get("task")}))
    evaluators = []
    if opts.eval_examples > 0:
        evaluators.append(answer_accuracy_evaluator(
            heldout[: opts.eval_examples], tokenizer, lambda m: render_for_completion(tokenizer, m), dev, env,
            opts.max_new_tokens, name="heldout_accuracy", sampler=sampler))
    stage = Stage(
        make_stream=lambda s, n: RolloutStream(tasks, tokenizer, sampler, stats, opts, prompts_per_batch, s, n,
                                               cfg.seed, cfg.max_seq_len, row_bucket(dev.type, dev.compile)),
        evaluators=evaluators,
        step_metrics=stats.read,
    )
    extra = {"data": described, "init_from": start.origin(), "num_samples": opts.num_samples, "lr_scale": opts.lr_scale,
             "normalize_std": opts.normalize_std, "task_weights": weights}
    return train(model, tokenizer, stage, cfg, dev, env, path, resume_from=resume_from, init_from=init_from,
                 extra_meta=extra, print_fn=print_fn)

