"""`portachat train base|...`: the training stages.

What runs. The flags are in commands/train.py, which `--help` imports without torch."""

from __future__ import annotations

import argparse
from dataclasses import replace

from portachat.commands.launch import maybe_launch
from portachat.commands.run.common import device_from_args, report_result
from portachat.commands.run.finetune_args import finetune_options, wants_finetune
from portachat.data.hub import pretraining_data_dir
from portachat.device import Device, destroy_distributed, dist_env
from portachat.i18n import _
from portachat.speedrun.presets import training_defaults
from portachat.storage.hubs import has_hub_prefix
from portachat.train.base import BaseOptions, run_base
from portachat.train.chat_stage import ChatOptions, run_chat_stage
from portachat.train.finetune import run_finetune
from portachat.train.grpo import run_grpo, wants_grpo
from portachat.train.lora import lora_from_flags
from portachat.train.optim import OptimConfig
from portachat.train.rl import RLOptions, run_rl
from portachat.train.trainer import TrainConfig, TrainingError


def train_config(args: argparse.Namespace, dev: Device, **overrides) -> TrainConfig:
    """The TrainConfig the shared training flags ask for; `overrides`: a stage's own fields (it is frozen)."""
    defaults = training_defaults(dev)
    return replace(TrainConfig(
        run=args.run,
        runs_root=args.runs_root,
        device_batch_size=args.device_batch_size or defaults.device_batch_size,
        activation_checkpointing=bool(args.activation_checkpointing),
        total_batch_size=args.total_batch_size,
        max_seq_len=args.max_seq_len or defaults.max_seq_len,
        warmup_ratio=args.warmup_ratio,
        warmdown_ratio=args.warmdown_ratio,
        final_lr_frac=args.final_lr_frac,
        grad_clip=args.grad_clip,
        eval_every=args.eval_every,
        eval_tokens=args.eval_tokens,
        sample_every=args.sample_every,
        save_every=args.save_every,
        keep_last=args.keep_last,
        log_every=args.log_every,
        seed=args.seed,
        max_bad_steps=args.max_bad_steps,
        fsdp=args.fsdp,
        optim=OptimConfig(
            matrix_lr=args.matrix_lr,
            embedding_lr=args.embedding_lr,
            unembedding_lr=args.unembedding_lr,
            scalar_lr=args.scalar_lr,
            weight_decay=args.weight_decay,
        ),
    ), **overrides)


def cmd_train_base(args: argparse.Namespace) -> int:
    if args.data and has_hub_prefix(args.data):
        # Downloaded here, before any launch: the ranks then find the shards on disk.
        args.data = str(pretraining_data_dir(args.data))
    launched = maybe_launch(args)  # --nproc N: re-run this command under torchrun
    if launched is not None:
        return launched

    dev = device_from_args(args)
    opts = BaseOptions(
        data=args.data,
        tokenizer=args.tokenizer,
        vocab_size=args.vocab_size,
        tokenizer_max_chars=args.tokenizer_max_chars,
        depth=args.depth if args.depth is not None else training_defaults(dev).depth,
        target_param_data_ratio=args.target_param_data_ratio,
        num_iterations=args.num_iterations,
        resume=args.resume,
        overwrite=args.overwrite,
        train=train_config(args, dev),
    )
    try:
        result = run_base(opts, dev=dev)
    finally:
        destroy_distributed()
    if result.final_checkpoint is not None and dist_env().is_main:
        print("[portachat] " + _("done: {steps} steps, validation bits/byte {bpb}").format(
            steps=result.steps, bpb=f"{result.val_bpb:.4f}"))
        print("[portachat] " + _("model: {path}").format(path=result.final_checkpoint))
    return 0


def cmd_train_chat(args: argparse.Namespace) -> int:
    launched = maybe_launch(args)  # --nproc N: re-run this command under torchrun
    if launched is not None:
        return launched

    dev = device_from_args(args)
    opts = ChatOptions(
        stage=args.stage,
        init=args.init,
        data=args.data or [],
        max_conversations=args.max_conversations,
        pack={"pack": True, "pad": False, None: None}[args.rows],
        lr_scale=args.lr_scale,
        warmdown_ratio=args.warmdown_ratio,
        num_epochs=args.num_epochs,
        num_iterations=args.num_iterations,
        max_seq_len=args.max_seq_len,
        eval_examples=args.eval_examples,
        eval_max_tokens=args.eval_max_tokens,
        resume=args.resume,
        overwrite=args.overwrite,
        train=train_config(args, dev, tokens_per_batch=args.tokens_per_batch),
    )
    try:
        result = (run_finetune(finetune_options(args, opts), dev=dev) if wants_finetune(args)
                  else run_chat_stage(opts, dev=dev))
    finally:
        destroy_distributed()
    return report_result(result, dist_env().is_main)


def cmd_train_rl(args: argparse.Namespace) -> int:
    launched = maybe_launch(args)  # --nproc N: re-run this command under torchrun
    if launched is not None:
        return launched

    dev = device_from_args(args)
    if args.device_batch_size == "auto":
        raise TrainingError(_("train rl: --device-batch-size auto is not supported (rows are groups of replies); "
                              "give a multiple of --num-samples ({n})").format(n=args.num_samples))
    rows = args.device_batch_size or args.num_samples * training_defaults(dev).rl_groups_per_row_batch
    cfg = train_config(args, dev, device_batch_size=rows)
    opts = RLOptions(
        init=args.init,
        data=args.data or [],
        max_prompts=args.max_prompts,
        num_samples=args.num_samples,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        normalize_std=args.normalize_std,
        lr_scale=args.lr_scale,
        warmdown_ratio=args.warmdown_ratio,
        num_epochs=args.num_epochs,
        num_iterations=args.num_iterations,
        eval_examples=args.eval_examples,
        rewards=args.reward or [],
        reward_weights=args.reward_weights,
        beta=args.beta,
        epsilon=args.epsilon,
        epsilon_high=args.epsilon_high,
        lr=args.lr,
        lora=lora_from_flags(args.lora_rank, args.lora_alpha, args.lora_targets, args.lora_dropout),
        merge=args.merge,
        resume=args.resume,
        overwrite=args.overwrite,
        train=cfg,
    )

    run = run_grpo if wants_grpo(args.init, opts.rewards) else run_rl  # GRPO on any model, scored by the rewards
    try:
        result = run(opts, dev=dev)
    finally:
        destroy_distributed()
    return report_result(result, dist_env().is_main)
