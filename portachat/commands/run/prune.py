"""`portachat prune` and `portachat compress`: smaller models from bigger ones.

What runs. The flags are in commands/prune.py, which `--help` imports without torch."""

from __future__ import annotations

import argparse

from portachat.commands.run.common import device_from_args
from portachat.compress.prune import PruneTargets
from portachat.compress.prune_run import PruneOptions, run_prune
from portachat.compress.recipe import CompressOptions, run_compress


def _prune_options(args: argparse.Namespace, output: str) -> PruneOptions:
    targets = PruneTargets(num_layers=args.target_num_layers, ffn_hidden_size=args.target_ffn_hidden_size,
                           num_attention_heads=args.target_num_attention_heads,
                           num_query_groups=args.target_num_query_groups, hidden_size=args.target_hidden_size)
    return PruneOptions(model=args.model, output=output, targets=targets, data=args.data,
                        calibration_samples=args.calibration_samples, seq_len=args.seq_len,
                        depth_metric=args.depth_metric, unstructured=args.unstructured,
                        sparsity_pattern=args.sparsity_pattern)


def cmd_prune(args: argparse.Namespace) -> int:
    result = run_prune(_prune_options(args, args.output), dev=device_from_args(args))
    print(f"  transformers: AutoModelForCausalLM.from_pretrained({str(result.path)!r})")
    return 0


def cmd_compress(args: argparse.Namespace) -> int:
    opts = CompressOptions(prune=_prune_options(args, args.output), output=args.output, heal_data=args.heal_data,
                           heal=args.heal, heal_steps=args.heal_steps, device_batch_size=args.device_batch_size,
                           eval_samples=args.eval_samples, gsm8k=args.gsm8k, gsm8k_examples=args.gsm8k_examples,
                           decode_tokens=args.decode_tokens)
    run_compress(opts, dev=device_from_args(args))
    return 0
