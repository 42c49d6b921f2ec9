"""`portachat train dpo` (preference alignment) and `portachat train prefs` (pairs from the model's own answers).

What runs. The flags are in commands/train_dpo.py, which `--help` imports without torch."""

from __future__ import annotations

import argparse

from portachat.commands.launch import maybe_launch
from portachat.commands.run.common import device_from_args, report_result
from portachat.commands.run.train import train_config
from portachat.device import destroy_distributed, dist_env
from portachat.train.dpo import DPOOptions, run_dpo
from portachat.train.lora import lora_from_flags
from portachat.train.self_prefs import PrefsOptions, run_prefs


def cmd_train_dpo(args: argparse.Namespace) -> int:
    launched = maybe_launch(args)  # --nproc N: re-run this command under torchrun
    if launched is not None:
        return launched

    dev = device_from_args(args)
    # Pairs per micro-batch (each pair is two rows): 4 unless --device-batch-size says otherwise.
    cfg = train_config(args, dev, **({} if args.device_batch_size is not None else {"device_batch_size": 4}))
    # The LoRA flags are fine-tuning's: parsed by the same function so every stage refuses the same mistakes.
    lora = lora_from_flags(args.lora_rank, args.lora_alpha, args.lora_targets, args.lora_dropout)
    opts = DPOOptions(
        init=args.init, data=args.data or [], loss=args.loss, beta=args.beta, gamma=args.simpo_gamma,
        reference=args.reference, max_pairs=args.max_pairs, val_pairs=args.val_pairs, lr=args.lr,
        weight_decay=args.weight_decay, num_epochs=args.num_epochs, num_iterations=args.num_iterations,
        max_seq_len=args.max_seq_len, eval_examples=args.eval_examples, eval_max_tokens=args.eval_max_tokens,
        lora=lora, merge=args.merge, activation_checkpointing=args.activation_checkpointing, resume=args.resume,
        overwrite=args.overwrite, train=cfg,
    )
    try:
        result = run_dpo(opts, dev=dev)
    finally:
        destroy_distributed()
    return report_result(result, dist_env().is_main)


def cmd_train_prefs(args: argparse.Namespace) -> int:
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks else None
    run_prefs(PrefsOptions(model=args.model, output=args.output, data=args.data or [], tasks=tasks,
                           num_prompts=args.num_prompts, num_samples=args.num_samples,
                           pairs_per_prompt=args.pairs_per_prompt, temperature=args.temperature,
                           max_new_tokens=args.max_new_tokens, seed=args.seed, device=args.device, dtype=args.dtype))
    return 0
