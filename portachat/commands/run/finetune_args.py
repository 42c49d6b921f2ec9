"""`train mid|sft` flags that fine-tune an existing model: when they ask for fine-tuning, and the
`FinetuneOptions` they make (built once, from the ChatOptions the command already made of them).
What runs: `--help` never imports this module."""

from __future__ import annotations

import argparse

from portachat.i18n import _
from portachat.model.source import PORTACHAT, resolve
from portachat.train.accumulation import TrainingError
from portachat.train.chat_stage import ChatOptions
from portachat.train.finetune import FinetuneOptions
from portachat.train.lora import lora_from_flags


def wants_finetune(args: argparse.Namespace) -> bool:
    """`train mid|sft` fine-tunes when asked for LoRA or when --init names a model that is not ours."""
    if getattr(args, "lora_rank", None) or getattr(args, "merge", False):
        return True
    if not getattr(args, "init", None):
        return False
    return resolve(args.init).format != PORTACHAT


def finetune_options(args: argparse.Namespace, chat: ChatOptions) -> FinetuneOptions:
    """FinetuneOptions from the parsed `train mid|sft` flags and the ChatOptions made from them."""
    if not chat.init:
        raise TrainingError(_("fine-tuning needs --init: a Hugging Face model directory, a .gguf file or a "
                              "checkpoint"))
    lora = lora_from_flags(args.lora_rank, args.lora_alpha, args.lora_targets, args.lora_dropout)
    return FinetuneOptions(
        init=chat.init, stage=chat.stage, data=chat.data, max_conversations=chat.max_conversations, pack=chat.pack,
        lr=args.lr, weight_decay=args.weight_decay, num_epochs=chat.num_epochs, num_iterations=chat.num_iterations,
        max_seq_len=chat.max_seq_len, eval_examples=min(chat.eval_examples, 16), eval_max_tokens=chat.eval_max_tokens,
        lora=lora, merge=args.merge, resume=chat.resume, overwrite=chat.overwrite, train=chat.train,
        activation_checkpointing=getattr(args, "activation_checkpointing", None),
    )
