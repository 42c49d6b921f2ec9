"""Fine-tuning an existing model (train/base_model.py loads it): full or LoRA, with the Trainer every
stage shares. The stages that start from a loaded model (sft/mid fine-tuning, DPO, GRPO,
distillation, compress's healing) hand `fit_finetune` their `Stage`; it plugs in fine-tuning's
optimizer and, for LoRA, adapter-only checkpoints, trains, then merges when asked.

Full fine-tuning saves an HF directory of the same architecture (same config family, tokenizer files,
chat template); LoRA saves only the adapter, in PEFT's format, through the same checkpoint writer
(optimizer, fp16 scaler, RNG and data positions included, so a LoRA run resumes exactly), and `merge`
also writes a plain checkpoint with the adapter folded in.

Optimizer: AdamW alone, at fine-tuning learning rates (2e-5 full, 2e-4 LoRA: the usual ranges for
models of this size). Muon's orthogonalized updates are sized for training from scratch: applied to
trained weights at its from-scratch rates they move every matrix by a large fixed-norm step and wreck
what the model knows, and LoRA's low-rank A/B pairs are not the matrices Muon's geometry is about.
The command line's flags become `FinetuneOptions` in commands/run/finetune_args.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from portachat.checkpoint import ModelWriter, read_meta
from portachat.checkpoint.sharded import is_sharded
from portachat.data.chat_data import Conversation
from portachat.data.chat_loader import Bucket, ChatLoader, longest_chat_row
from portachat.device import Device, DistEnv
from portachat.device.policy import finetune_activation_checkpointing
from portachat.device.shapes import row_bucket
from portachat.i18n import _
from portachat.model import GPT
from portachat.model.load import load_for_inference
from portachat.model.model_dir import META, save_model_files
from portachat.model.source import resolve
from portachat.storage.atomic import atomic_directory
from portachat.train.base_model import BaseModel, load_base, pad_id
from portachat.train.chat_eval import answer_accuracy_evaluator, val_loss_evaluator
from portachat.train.chat_stage import split_conversations
from portachat.train.defaults import FULL_LR, LORA_LR
from portachat.train.finetune_batch import probe_rows, resolve_finetune_batch_size
from portachat.train.finetune_optim import finetune_optimizer
from portachat.train.hooks import LossHook, ModelFiles, token_loss
from portachat.train.lora import (
    LoraOptions,
    adapter_state_dict,
    add_lora,
    load_adapter,
    merge_lora,
    restore_adapter,
    save_adapter,
)
from portachat.train.stage import Render, begin_stage, plan_iterations
from portachat.train.trainer import Stage, TrainConfig, TrainingError, TrainResult, train

MERGED = "merged"  # <stage>/merged/: the last LoRA checkpoint folded into a plain model (--merge)


@dataclass
class FinetuneOptions:
    init: str  # HF directory, .gguf file, or our checkpoint
    stage: str = "sft"  # "sft" (one conversation per padded row) or "mid" (packed rows)
    data: list[str] = field(default_factory=list)  # conversations; empty = the built-in synthetic tasks
    max_conversations: int | None = None
    pack: bool | None = None  # None = packed for mid, padded for sft
    lr: float | None = None  # None = FULL_LR or LORA_LR
    weight_decay: float = 0.0
    num_epochs: float = 1.0
    num_iterations: int | None = None
    max_seq_len: int | None = None  # None = min(the model's context, 2048)
    eval_examples: int = 16  # held-out conversations answered at each evaluation (0 = none)
    eval_max_tokens: int = 128
    val_conversations: int = 64  # held-out conversations for the validation loss
    lora: LoraOptions | None = None  # None = full fine-tuning
    merge: bool = False  # LoRA: also write <stage>/merged/ with the adapter folded in
    # None = on for a CPU: a laptop's memory, not its compute, is what the README's first example runs out of
    activation_checkpointing: bool | None = None
    resume: str | None = None
    overwrite: bool = False
    train: TrainConfig = field(default_factory=TrainConfig)


# ----------------------------------------------------------------------------- data


class TemplateChatLoader(ChatLoader):
    """ChatLoader (packing, padding, token budget, streams, resumable position) over a given renderer."""

    def __init__(self, conversations: Sequence[Conversation], render: Render, pad: int, batch_size: int,
                 seq_len: int, **kwargs: Any) -> None:
        super().__init__(conversations, None, batch_size, seq_len, render=render, pad_id=pad, **kwargs)


# ----------------------------------------------------------------------------- the trainer


def adapter_files(lora: LoraOptions, base_path: Path) -> ModelFiles:
    """A LoRA run's checkpoints hold only its adapter (PEFT format), the tokenizer and portachat.json."""

    def gather(model: torch.nn.Module, tokenizer: Any) -> ModelWriter:
        tensors = adapter_state_dict(model)  # a collective under FSDP2: every rank gathers its shards

        def write(tmp: Path, meta: dict[str, Any]) -> None:
            save_adapter(tmp, tensors, lora, base_model=str(base_path))
            tokenizer.save(tmp, model_max_length=model.config.max_seq_len)
            full = {**meta, "model_config": model.config.to_dict(), "tokenizer_fingerprint": tokenizer.fingerprint()}
            (tmp / META).write_text(json.dumps(full, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")

        return write

    return ModelFiles(gather=gather, load=restore_adapter)


def fit_finetune(model: GPT, base: BaseModel, stage: Stage, cfg: TrainConfig, dev: Device, env: DistEnv, path: Path,
                 *, lr: float, weight_decay: float, lora: LoraOptions | None, merge: bool, resume_from: Path | None,
                 extra_meta: dict[str, Any], print_fn: Callable[[str], None] = print) -> TrainResult:
    """Every fine-tuning stage's end: the Trainer with fine-tuning's optimizer (and adapter checkpoints for
    LoRA) plugged into `stage`, trained (resuming where asked), then `--merge`."""
    fused = dev.fused_optimizer
    stage = replace(stage, optimizers=lambda m: [finetune_optimizer(m, lr, weight_decay, fused)],
                    model_files=adapter_files(lora, base.path) if lora is not None else None)
    meta = {**extra_meta, "lora": vars(lora)} if lora is not None else extra_meta
    result = train(model, base.tokenizer, stage, cfg, dev, env, path, resume_from=resume_from, extra_meta=meta,
                   print_fn=print_fn)
    say = print_fn if env.is_main else (lambda _m: None)
    merge_if_asked(merge, result, path, model, base, env, say)
    return result


def write_merged(stage_path: Path, model: GPT, base: BaseModel, meta: dict[str, Any]) -> Path:
    """<stage>/merged/: a plain checkpoint of the same architecture with the adapter folded in (atomic)."""
    final = stage_path / MERGED
    with atomic_directory(final) as tmp:  # a full disk says so, and leaves no half-written merged/
        save_model_files(tmp, merge_lora(model), base.tokenizer, meta, generation_defaults=base.generation)
    return final


def merge_if_asked(merge: bool, result: TrainResult, stage_path: Path, model: GPT, base: BaseModel, env: DistEnv,
                   say: Callable[[str], None]) -> None:
    """`--merge`: after a LoRA run, <stage>/merged/ with the adapter folded in (rank 0 writes, all ranks wait).
    A model sharded by FSDP2 is not merged in place: rank 0 loads the base whole and the saved adapter."""
    if merge and env.is_main:
        meta = {**read_meta(result.final_checkpoint), "merged_from": str(result.final_checkpoint)}
        for key in ("data_position", "lora"):
            meta.pop(key, None)
        if is_sharded(model):
            whole = load_for_inference(resolve(base.path), device=torch.device("cpu"), dtype=torch.float32).model
            model = load_adapter(whole, result.final_checkpoint)
        merged = write_merged(stage_path, model, base, meta)
        say("[portachat] " + _("merged model (adapter folded in): {path}").format(path=merged))
    if merge and env.is_distributed:
        dist.barrier()


# ----------------------------------------------------------------------------- the stage


@dataclass
class ChatDataPlan:
    """The conversations a chat-shaped fine-tuning stage trains and holds out, and its step count."""

    cfg: TrainConfig  # num_iterations filled in
    train: list[Conversation]
    val: list[Conversation]
    described: str  # where the conversations came from, for the log and meta.json
    bucket: Bucket  # the device layer's row-length rounding
    lengths: dict[int, int]  # rendered lengths, shared by the planner and every stream


Split = tuple[list[Conversation], list[Conversation], str]  # (train, held out, where they came from)


def plan_chat_data(stage: str, split: Split, base: BaseModel, cfg: TrainConfig, dev: Device, env: DistEnv,
                   lr: float, pack: bool, num_epochs: float, num_iterations: int | None,
                   say: Callable[[str], None], loss: LossHook = token_loss,
                   resident: Sequence[torch.nn.Module] = (), describe: str | None = None) -> ChatDataPlan:
    """Given the split conversations (chat_stage.split_conversations): warn about rows whose prompt leaves
    no reply token, settle `--device-batch-size auto` (base.model probed as it trains, with the stage's `loss` and the `resident`
    modules it keeps in memory, on the data's widest rows; `describe`: the line saying so) and plan the
    steps: what sft/mid and distillation do before they build their streams."""
    train_convs, val_convs, described = split
    say(f"[portachat] {stage}: " + _("{n} training conversations from {source}, {held_out} held out; "
                                     "AdamW lr {lr}").format(
        n=len(train_convs), source=described, held_out=len(val_convs), lr=f"{lr:g}"))
    sample = train_convs[:: max(1, len(train_convs) // 50)][:50]
    unsupervised = sum(not any(base.render(c["messages"], cfg.max_seq_len + 1)[1][1:]) for c in sample)
    if unsupervised:
        say("[portachat] " + _("WARNING: {n} of {sampled} sampled conversations have no reply token within "
                               "--max-seq-len {seq_len} (the prompt fills the row); they teach nothing. Raise "
                               "--max-seq-len.").format(n=unsupervised, sampled=len(sample), seq_len=cfg.max_seq_len))
    bucket = row_bucket(dev.type, dev.compile)
    lengths: dict[int, int] = {}
    vocab = base.model.config.vocab_size
    cfg = resolve_finetune_batch_size(
        cfg, base.model, dev, env, say, lambda: longest_chat_row(train_convs, base.render, cfg.max_seq_len, bucket, pack,
                                                                 lengths),
        most=len(train_convs), make_batch=lambda b, w: probe_rows(b, w, vocab, packed=pack), loss=loss,
        resident=resident, describe=describe)
    streams = env.world_size * cfg.grad_accum_steps(env.world_size)
    cfg = replace(cfg, num_iterations=num_iterations or plan_iterations(
        train_convs, base.render, cfg, pack, num_epochs, streams, bucket, lengths))
    return ChatDataPlan(cfg, list(train_convs), list(val_convs), described, bucket, lengths)


def run_finetune(opts: FinetuneOptions, dev: Device | None = None, print_fn=print) -> TrainResult:
    """Fine-tune `opts.init` (full or LoRA) and return the final checkpoint (the adapter, for LoRA)."""
    if opts.stage not in ("mid", "sft"):
        raise TrainingError(_("fine-tuning runs as `mid` or `sft`, not {stage}").format(stage=repr(opts.stage)))
    if opts.merge and opts.lora is None:
        raise TrainingError(_("--merge folds a LoRA adapter into the model: pass --lora-rank R with it"))
    start = begin_stage(opts.stage, opts.train, dev, print_fn, resume=opts.resume, overwrite=opts.overwrite)
    dev, env, say, cfg, path, resume_from = start.dev, start.env, start.say, start.cfg, start.path, start.resume_from
    base = load_base(opts.init, dev)
    model = base.model
    if opts.lora is not None:
        add_lora(model, opts.lora)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    mode = _("LoRA r={rank} alpha={alpha} on {targets}").format(
        rank=opts.lora.rank, alpha=f"{opts.lora.alpha:g}", targets=",".join(opts.lora.targets)) if opts.lora else _("full")
    say(f"[portachat] {opts.stage}: " + _("fine-tuning {path} ({mode}; {trainable} of {total} parameters train)").format(
        path=base.path, mode=mode, trainable=f"{trainable:,}", total=f"{sum(p.numel() for p in model.parameters()):,}"))
    ac = opts.activation_checkpointing
    cfg = replace(cfg, max_seq_len=opts.max_seq_len or min(model.config.max_seq_len, 2048),
                  activation_checkpointing=finetune_activation_checkpointing(dev.type) if ac is None else ac)
    if ac is None and cfg.activation_checkpointing:
        say(f"[portachat] {opts.stage}: " + _(
            "activation checkpointing on (fine-tuning's default on a {device}: about a third of the memory for ~35% "
            "more time; --no-activation-checkpointing turns it off)").format(device=dev.type))
    lr = opts.lr if opts.lr is not None else (LORA_LR if opts.lora else FULL_LR)
    pack = opts.pack if opts.pack is not None else opts.stage == "mid"

    split = split_conversations(opts.stage, opts.data, opts.max_conversations, opts.eval_examples, cfg.seed)
    data = plan_chat_data(opts.stage, split, base, cfg, dev, env, lr, pack, opts.num_epochs, opts.num_iterations, say)
    cfg, train_convs, val_convs, described, bucket, lengths = (
        data.cfg, data.train, data.val, data.described, data.bucket, data.lengths)
    B, T, pad = cfg.device_batch_size, cfg.max_seq_len, pad_id(base.tokenizer)
    evaluators = [val_loss_evaluator(val_convs[: opts.val_conversations], base.render, pad, B, T, dev, env, bucket)]
    if opts.eval_examples > 0:
        evaluators.append(answer_accuracy_evaluator(val_convs[: opts.eval_examples], base.tokenizer, base.prompt, dev,
                                                    env, opts.eval_max_tokens, name="answer_accuracy"))
    stage = Stage(
        make_stream=lambda s, n: TemplateChatLoader(train_convs, base.render, pad, B, T, pack=pack, stream=s,
                                                    num_streams=n, seed=cfg.seed, tokens_per_batch=cfg.tokens_per_batch,
                                                    bucket=bucket, length_cache=lengths).prepare(),
        evaluators=evaluators,
    )
    extra = {"data": described, "init_from": str(base.path), "pack": pack, "finetune": "lora" if opts.lora else "full",
             "lr": lr}
    return fit_finetune(model, base, stage, cfg, dev, env, path, lr=lr, weight_decay=opts.weight_decay, lora=opts.lora,
                        merge=opts.merge, resume_from=resume_from, extra_meta=extra, print_fn=print_fn)
