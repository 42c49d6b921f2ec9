"""`portachat distill`: train a student to match a teacher's next-token distributions.

What runs. The flags are in commands/distill.py, which `--help` imports without torch."""

from __future__ import annotations

import argparse

from portachat.commands.launch import maybe_launch
from portachat.commands.run.common import device_from_args, report_result
from portachat.commands.run.train import train_config
from portachat.device import Device, destroy_distributed, dist_env
from portachat.train.distill import DistillOptions, run_distill
from portachat.train.distill_loss import LOSSES, DistillLoss
from portachat.train.lora import lora_from_flags


def distill_options(args: argparse.Namespace, dev: Device) -> DistillOptions:
    lora = lora_from_flags(args.lora_rank, args.lora_alpha, args.lora_targets, args.lora_dropout)
    beta = args.beta if args.beta is not None else LOSSES[args.loss]
    loss = DistillLoss(beta=beta, temperature=args.temperature, alpha=args.alpha, top_k=args.top_k or None)
    train = train_config(args, dev, tokens_per_batch=args.tokens_per_batch)
    return DistillOptions(
        teacher=args.teacher, teacher_model=args.teacher_model, student=args.student, student_depth=args.student_depth, data=args.data or [],
        max_conversations=args.max_conversations, loss=loss, on_policy=args.on_policy,
        max_new_tokens=args.max_new_tokens, sample_temperature=args.sample_temperature, lr=args.lr,
        weight_decay=args.weight_decay, num_epochs=args.num_epochs, num_iterations=args.num_iterations,
        max_seq_len=args.max_seq_len, lora=lora, merge=args.merge, activation_checkpointing=args.activation_checkpointing,
        resume=args.resume, overwrite=args.overwrite, train=train,
    )


def cmd_distill(args: argparse.Namespace) -> int:
    launched = maybe_launch(args)  # --nproc N: re-run this command under torchrun
    if launched is not None:
        return launched

    dev = device_from_args(args)
    try:
        result = run_distill(distill_options(args, dev), dev=dev)
    finally:
        destroy_distributed()
    return report_result(result, dist_env().is_main)
