"""GRPO for any model: `portachat train rl --init MODEL --data prompts.jsonl --reward ...`.

The model loads as fine-tuning loads it (a Hugging Face directory, a GGUF, or one of our
checkpoints: train.base_model.load_base) and trains with AdamW in fp32. Each micro-batch takes a few
prompts, samples G replies to each through the engine in this process (train.rollout: paged
KV, continuous batching, a prompt's blocks shared by its G replies), scores them with the rewards
(built-ins or the user's TRL-style functions, weighted: train.rewards), and turns each group's
rewards into advantages (reward minus the group's mean, optionally over its std). The loss is the
clipped ratio with an optional k3 KL to the starting model, summed over the sampled tokens and
divided by their count over the whole step (train.grpo_loss). After each optimizer step the engine
samples from the new weights without a reload, and while the trainer runs the forward and backward
its KV cache is given back. With --lora-rank only a LoRA adapter trains: the engine samples with it
(its values copied in after each step), the KL's reference is the same weights with the adapter
switched off, and --merge folds it in at the end as `train sft` does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import torch

from portachat.data.batch import Batch
from portachat.data.chat_loader import Bucket
from portachat.data.prompt_data import PromptRow, load_prompts
from portachat.device import Device, DistEnv
from portachat.device.inference import training_engine_dtype
from portachat.device.shapes import pad_bucket, row_bucket
from portachat.eval.generation import as_chat_tokenizer
from portachat.i18n import _
from portachat.model import GPT
from portachat.model.source import PORTACHAT, resolve
from portachat.train.base_model import BaseModel, load_base, pad_id
from portachat.train.collectives import sum_over_ranks
from portachat.train.engine_copy import inference_copy
from portachat.train.finetune import fit_finetune
from portachat.train.grpo_loss import GRPOLoss, group_advantages
from portachat.train.hooks import Evaluator
from portachat.train.lora import add_lora
from portachat.train.rewards import Rewards
from portachat.train.rl import RLOptions, RolloutStats, rollout_batch
from portachat.train.rollout import Reply, Rollout
from portachat.train.stage import begin_stage
from portachat.train.trainer import Stage, TrainingError, TrainResult

GRPO_LR = 1e-6  # TRL's GRPOConfig default: RL updates of a trained model are small
GRPO_LORA_LR = 1e-5  # an adapter starts at zero and has few weights: it needs larger steps (TRL's LoRA examples)


def wants_grpo(init: str | None, rewards: Sequence[str]) -> bool:
    """`train rl` runs GRPO when given rewards; an existing model (not our checkpoint) without any is refused
    with what to add (the synthetic-task RL path reads only our checkpoints)."""
    if rewards:
        return True
    if init and resolve(init).format != PORTACHAT:
        raise TrainingError(_("--init {init} is an existing model, not a portachat checkpoint: RL on it is GRPO, "
                              "which needs --data PROMPTS.jsonl and at least one --reward (e.g. --reward gsm8k)").format(
            init=init))
    return False


def prompt_ids(base: BaseModel, chat_tok, row: PromptRow) -> list[int]:
    """A prompt's token ids: a conversation through the model's chat template, plain text as it is
    (after BOS where the tokenizer puts one before text)."""
    if row.conversational:
        return list(base.prompt(row.prompt))
    bos = [chat_tok.bos_id] if getattr(chat_tok, "adds_bos", False) and chat_tok.bos_id is not None else []
    return bos + chat_tok.encode(row.prompt)


def columns_of(rows: Sequence[PromptRow], repeat: int) -> dict[str, list]:
    """The rows' extra columns as the rewards take them: one value per completion (None where a row lacks it)."""
    keys = sorted({k for r in rows for k in r.columns})
    return {k: [r.columns.get(k) for r in rows for _ in range(repeat)] for k in keys}


class GroupScorer:
    """Samples and scores groups: (prompts' ids, replies, rewards [groups, G])."""

    def __init__(self, base: BaseModel, chat_tok, sampler: Rollout, rewards: Rewards) -> None:
        self.base, self.chat_tok, self.sampler, self.rewards = base, chat_tok, sampler, rewards
        self.reward_sums = torch.zeros(2 * len(rewards.names), dtype=torch.float64)  # (sum, count) per function

    def run(self, rows: Sequence[PromptRow], group_size: int, max_tokens: int, temperature: float, seed: int,
            ) -> tuple[list[list[int]], list[Reply], torch.Tensor]:
        prompts = [prompt_ids(self.base, self.chat_tok, r) for r in rows]
        groups = self.sampler.sample_groups(prompts, group_size, max_tokens, temperature, seed)
        replies = [self.sampler.reply(ids) for group in groups for ids in group]  # the calculator's output masked
        texts = [r.text for r in replies]
        shown_prompts = [r.prompt for r in rows for _ in range(group_size)]
        completions = [[{"role": "assistant", "content": t}] if rows[i // group_size].conversational else t
                       for i, t in enumerate(texts)]  # TRL's two formats
        values, applied = self.rewards.score(shown_prompts, completions, [r.token_ids for r in replies],
                                             columns_of(rows, group_size))
        for k, name in enumerate(self.rewards.names):  # over the completions each function applied to
            self.reward_sums[2 * k : 2 * k + 2] += torch.tensor(applied[name], dtype=torch.float64)
        rewards = torch.tensor(values, dtype=torch.float32).view(len(rows), group_size)
        return [p for p in prompts for _ in range(group_size)], replies, rewards

    def read_means(self, dev: Device, env: DistEnv) -> dict[str, float]:
        """Each reward function's mean since the last read, over every rank (a collective when distributed)."""
        values = sum_over_ranks(self.reward_sums.to(dev.torch_device), env).tolist()
        self.reward_sums.zero_()
        return {f"reward/{name}": values[2 * k] / values[2 * k + 1] for k, name in enumerate(self.rewards.names)
                if values[2 * k + 1] > 0}


class GroupStream:
    """Stream s of n: prompts s, s+n, ... ; each batch = prompts_per_batch groups of G replies."""

    def __init__(self, rows: list[PromptRow], scorer: GroupScorer, stats: RolloutStats, opts: RLOptions,
                 prompts_per_batch: int, pad_id: int, stream: int, num_streams: int, seed: int, max_len: int,
                 bucket: Bucket = pad_bucket) -> None:  # fmt: skip
        self.rows, self.scorer, self.stats, self.opts = rows, scorer, stats, opts
        self.max_len, self.bucket = max_len, bucket
        self.prompts_per_batch, self.pad_id, self.seed, self.stream = prompts_per_batch, pad_id, seed, stream
        self.mine = list(range(stream % len(rows), len(rows), num_streams)) or [stream % len(rows)]
        self.index = 0

    def next_batch(self) -> Batch:
        G = self.opts.num_samples
        picked = [self.rows[self.mine[(self.index + k) % len(self.mine)]] for k in range(self.prompts_per_batch)]
        seed = (self.seed * 1_000_003 + self.stream * 7919 + self.index) * 64
        prompts, replies, rewards = self.scorer.run(picked, G, self.opts.max_new_tokens, self.opts.temperature, seed)
        self.index += self.prompts_per_batch
        self.stats.add(rewards, [sum(r.mask) for r in replies])
        adv = group_advantages(rewards, self.opts.normalize_std).flatten().tolist()
        self.scorer.sampler.sleep()  # the KV cache's memory is the trainer's until the next batch
        return rollout_batch(prompts, replies, adv, self.pad_id, self.max_len, self.bucket)

    def state_dict(self) -> dict:
        return {"index": self.index, "count": len(self.rows)}

    def load_state_dict(self, state: dict) -> None:
        if state.get("count") == len(self.rows):
            self.index = int(state["index"])


def heldout_reward_evaluator(rows: Sequence[PromptRow], scorer: GroupScorer, dev: Device, env: DistEnv,
                             max_tokens: int) -> Evaluator:
    """Mean reward of greedy replies to held-out prompts (each rank its share, summed)."""
    mine = list(rows[env.rank :: env.world_size])

    def evaluate(model: GPT, step: int) -> dict[str, float]:
        total = torch.zeros(2, dtype=torch.float64)
        if mine:
            saved = scorer.reward_sums.clone()  # greedy held-out replies do not count as training rollouts
            _p, _r, rewards = scorer.run(mine, 1, max_tokens, 0.0, seed=0)
            scorer.sampler.sleep()
            scorer.reward_sums.copy_(saved)
            total += torch.tensor([float(rewards.sum()), float(rewards.numel())], dtype=torch.float64)
        else:
            scorer.sampler.sync()  # under FSDP2 a collective: every rank takes part
        total = sum_over_ranks(total.to(dev.torch_device), env)
        return {"heldout_reward": float(total[0] / total[1])} if total[1] > 0 else {}

    return evaluate


def run_grpo(opts: RLOptions, dev: Device | None = None, print_fn=print) -> TrainResult:
    """GRPO on `opts.init` (any model) over the prompts of `opts.data`, scored by `opts.rewards`."""
    if not opts.init or not opts.data or not opts.rewards:
        raise TrainingError(_("GRPO on an existing model needs --init MODEL, --data PROMPTS.jsonl and at least one "
                              "--reward"))
    if opts.merge and opts.lora is None:
        raise TrainingError(_("--merge folds a LoRA adapter into the model: pass --lora-rank R with it"))
    if opts.num_samples < 2:
        raise TrainingError(_("--num-samples must be at least 2: advantages compare replies within a group"))
    batch = opts.train.device_batch_size
    if batch == "auto" or batch % opts.num_samples:
        raise TrainingError(_("--device-batch-size {batch} must be a multiple of --num-samples {samples} (each row "
                              "is one reply; a prompt's G replies share a micro-batch)").format(
            batch=batch, samples=opts.num_samples))
    rewards = Rewards(opts.rewards, opts.reward_weights)
    start = begin_stage("rl", opts.train, dev, print_fn, resume=opts.resume, overwrite=opts.overwrite)
    dev, env, say, cfg, path, resume_from = start.dev, start.env, start.say, start.cfg, start.path, start.resume_from
    if opts.lora is not None and cfg.fsdp == "on" and env.world_size > 1:
        raise TrainingError(_("GRPO with --lora-rank keeps a whole model on every device: pass --fsdp off"))
    base = load_base(opts.init, dev)
    model = base.model
    if opts.lora is not None:  # only the adapter trains; the engine runs the frozen base plus the adapter
        add_lora(model, opts.lora)
    chat_tok = as_chat_tokenizer(base.tokenizer)
    rows = load_prompts(opts.data, opts.max_prompts)
    limit = model.config.max_seq_len - opts.max_new_tokens
    fitting = [r for r in rows if len(prompt_ids(base, chat_tok, r)) <= limit]
    if not fitting:
        raise TrainingError(_("no prompt fits the model's context of {ctx} tokens with --max-new-tokens {n}").format(
            ctx=model.config.max_seq_len, n=opts.max_new_tokens))
    if len(fitting) < len(rows):
        say("[portachat] " + _("rl: {n} prompts longer than {limit} tokens skipped (the context minus "
                               "--max-new-tokens)").format(n=len(rows) - len(fitting), limit=limit))
    n_val = min(opts.eval_examples, len(fitting) // 10)
    train_rows, heldout = fitting[: len(fitting) - n_val], fitting[len(fitting) - n_val :]
    longest = max(len(prompt_ids(base, chat_tok, r)) for r in fitting) + opts.max_new_tokens
    cfg = replace(cfg, max_seq_len=longest, warmdown_ratio=opts.warmdown_ratio)
    sampler = Rollout(model, chat_tok, dev, max_num_seqs=cfg.device_batch_size, max_model_len=longest,
                           lora=opts.lora is not None)
    scorer = GroupScorer(base, chat_tok, sampler, rewards)
    prompts_per_batch = cfg.device_batch_size // opts.num_samples
    streams = env.world_size * cfg.grad_accum_steps(env.world_size)
    cfg = replace(cfg, num_iterations=opts.num_iterations or max(
        1, math.ceil(opts.num_epochs * len(train_rows) / (prompts_per_batch * streams))))
    lr = opts.lr if opts.lr is not None else (GRPO_LORA_LR if opts.lora else GRPO_LR)
    say(f"[portachat] {cfg.stage}: " + _("GRPO on {path}: {n} prompts from {source} ({held_out} held out), {samples} "
                                         "replies each, {per_step} prompts per step; rewards {rewards}; AdamW lr "
                                         "{lr}").format(
        path=base.path, n=len(train_rows), source=", ".join(opts.data), held_out=len(heldout),
        samples=opts.num_samples, per_step=prompts_per_batch * streams,
        rewards=", ".join(f"{n}x{w:g}" for n, w in zip(rewards.names, rewards.weights, strict=True)), lr=f"{lr:g}"))
    if opts.lora is not None:
        say(f"[portachat] {cfg.stage}: " + _("LoRA r={rank} alpha={alpha} on {targets}").format(
            rank=opts.lora.rank, alpha=f"{opts.lora.alpha:g}", targets=",".join(opts.lora.targets)))
    reference = None
    if opts.beta != 0.0 and opts.lora is not None:  # the base: the same weights with the adapter switched off
        reference = model
    elif opts.beta != 0.0:  # the starting weights, frozen (in the inference dtype where the device has one)
        reference = inference_copy(model, training_engine_dtype(dev) or torch.float32)
    stats = RolloutStats(dev, env)
    pad = pad_id(base.tokenizer)

    def step_metrics() -> dict[str, float]:
        return {**stats.read(), **scorer.read_means(dev, env), "kv_freed_bytes": float(sampler.freed_bytes)}

    stage = Stage(
        make_stream=lambda s, n: GroupStream(train_rows, scorer, stats, opts, prompts_per_batch, pad, s, n, cfg.seed,
                                             cfg.max_seq_len, row_bucket(dev.type, dev.compile)),
        loss=GRPOLoss(opts.epsilon, opts.epsilon_high, opts.beta, reference, reference_is_base=opts.lora is not None),
        evaluators=[heldout_reward_evaluator(heldout, scorer, dev, env, opts.max_new_tokens)] if heldout else [],
        step_metrics=step_metrics,
    )
    extra = {"data": ", ".join(opts.data), "init_from": str(base.path), "finetune": "lora" if opts.lora else "full",
             "lr": lr,
             "grpo": {"num_samples": opts.num_samples, "rewards": rewards.specs, "reward_weights": rewards.weights,
                      "beta": opts.beta, "epsilon": opts.epsilon, "epsilon_high": opts.epsilon_high,
                      "normalize_std": opts.normalize_std}}
    return fit_finetune(model, base, stage, cfg, dev, env, path, lr=lr, weight_decay=0.0, lora=opts.lora,
                        merge=opts.merge, resume_from=resume_from, extra_meta=extra, print_fn=print_fn)
