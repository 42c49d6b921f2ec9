"""Fine-tuning an existing model (a Hugging Face directory or a GGUF of the Llama / SmolLM2, Qwen2,
Qwen3 families, or one of our checkpoints): full or LoRA, with the Trainer every stage shares.

The model keeps its own tokenizer and chat template; loss masks come from that template
(portachat.tokenizer.template_masks). Full fine-tuning saves an HF directory of the same
architecture (same config family, tokenizer files, chat template); LoRA saves only the adapter, in
PEFT's format, and `merge` also writes a plain checkpoint with the adapter folded in.

Optimizer: AdamW alone, at fine-tuning learning rates (2e-5 full, 2e-4 LoRA: the usual ranges for
models of this size). Muon's orthogonalized updates are sized for training from scratch: applied to
trained weights at its from-scratch rates they move every matrix by a large fixed-norm step and wreck
what the model knows, and LoRA's low-rank A/B pairs are not the matrices Muon's geometry is about.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from portachat.checkpoint import read_meta
from portachat.checkpoint.sharded import is_sharded
from portachat.checkpoint.trainer_state import collect_optimizers, save_rng, write_optimizers
from portachat.checkpoint.writer import gather_positions, gather_rngs, step_directory
from portachat.data.batch import Batch
from portachat.data.chat_data import Conversation
from portachat.data.chat_loader import Bucket, ChatLoader, longest_chat_row, rows_to_batch
from portachat.device import Device, DistEnv
from portachat.device.policy import finetune_activation_checkpointing
from portachat.device.shapes import pad_bucket, row_bucket
from portachat.engine import SamplingParams
from portachat.engine.oneshot import engine_for
from portachat.eval.generation import reply_text
from portachat.i18n import _
from portachat.model import GPT
from portachat.model.load import load_for_inference
from portachat.model.model_dir import META, save_model_files
from portachat.model.source import PEFT, PORTACHAT, is_portachat_dir, resolve
from portachat.storage.atomic import atomic_directory
from portachat.tokenizer import Tokenizer, render_conversation
from portachat.tokenizer.chat import render_for_completion
from portachat.tokenizer.chat_tokenizer import PortachatChatTokenizer
from portachat.tokenizer.template_masks import render_template_conversation, render_template_prompt
from portachat.train.chat_eval import is_correct
from portachat.train.chat_stage import ChatOptions, split_conversations
from portachat.train.defaults import FULL_LR, LORA_LR
from portachat.train.engine_copy import engine_weights
from portachat.train.finetune_batch import probe_rows, resolve_finetune_batch_size
from portachat.train.finetune_optim import finetune_optimizer
from portachat.train.hooks import LossHook, token_loss
from portachat.train.lora import (
    LoraOptions,
    adapter_state_dict,
    add_lora,
    load_adapter,
    lora_from_flags,
    merge_lora,
    save_adapter,
)
from portachat.train.stage import Render, begin_stage, plan_iterations
from portachat.train.trainer import Stage, TrainConfig, Trainer, TrainingError, TrainResult

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


# ----------------------------------------------------------------------------- model and data


@dataclass
class BaseModel:
    model: GPT  # fp32, trainable, on the device
    tokenizer: Any  # our Tokenizer or the model's TemplateChatTokenizer (both save next to a checkpoint)
    render: Render
    prompt: Callable[[Any], list[int]]  # messages -> ids asking for the next assistant reply
    generation: dict[str, Any]
    path: Path


def load_base(spec: str | Path, dev: Device) -> BaseModel:
    """The model to fine-tune, in fp32 on the device (autocast gives the compute dtype), with its tokenizer."""
    source = resolve(spec)
    path = source.path
    loaded = load_for_inference(source, device=dev.torch_device, dtype=torch.float32)
    model = loaded.model
    model.requires_grad_(True)
    if model.config.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.train()
    gen = loaded.generation
    generation = {k: v for k, v in vars(gen).items() if v is not None and k != "max_new_tokens"}
    if source.format == PORTACHAT or (source.format == PEFT and is_portachat_dir(path)):  # a LoRA run of ours
        tok = Tokenizer.load(path)
        return BaseModel(model, tok, lambda m, n: render_conversation(tok, m, n),
                         lambda m: render_for_completion(tok, m), generation, path)
    tok = loaded.tokenizer
    return BaseModel(model, tok, lambda m, n: render_template_conversation(tok, m, n),
                     lambda m: render_template_prompt(tok, m), generation, path)


def pad_id(tokenizer: Any) -> int:
    """Any id the model embeds: padded positions are never targets and come after the real tokens."""
    if tokenizer.bos_id is not None:
        return tokenizer.bos_id
    eos = tokenizer.eos_id
    return eos if isinstance(eos, int) else eos[0]


class TemplateChatLoader(ChatLoader):
    """ChatLoader (packing, padding, token budget, streams, resumable position) over a given renderer."""

    def __init__(self, conversations: Sequence[Conversation], render: Render, pad: int, batch_size: int,
                 seq_len: int, **kwargs: Any) -> None:
        super().__init__(conversations, None, batch_size, seq_len, render=render, pad_id=pad, **kwargs)


def held_out_sums(convs: Sequence[Conversation], render: Render, pad: int, batch_size: int, seq_len: int,
                  dev: Device, bucket: Bucket, loss_sum: Callable[[Batch], torch.Tensor]) -> torch.Tensor:
    """[summed loss, supervised tokens] over held-out conversations, every rank its share, summed over ranks
    (no gradients). `loss_sum(batch on the device)` is the batch's summed loss, computed under autocast."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    mine = list(convs[rank::world])
    total = torch.zeros(2, dtype=dev.accumulate_dtype, device=dev.torch_device)
    with torch.no_grad():
        for i in range(0, len(mine), batch_size):
            rows = [render(c["messages"], seq_len + 1) for c in mine[i : i + batch_size]]
            batch = rows_to_batch(rows, pad, seq_len, bucket).to(dev.torch_device)
            with dev.autocast():
                loss = loss_sum(batch)
            total += torch.stack([loss.to(total.dtype), (batch.targets >= 0).sum().to(total.dtype)])
    if world > 1:
        dist.all_reduce(total)
    return total


def val_loss_evaluator(convs: Sequence[Conversation], render: Render, pad: int, batch_size: int, seq_len: int,
                       dev: Device, bucket: Bucket = pad_bucket) -> Callable[[GPT, int], dict[str, float]]:
    """Mean cross-entropy per supervised token on held-out conversations (every rank its share)."""

    def evaluate(model: GPT, step: int) -> dict[str, float]:
        total = held_out_sums(convs, render, pad, batch_size, seq_len, dev, bucket,
                              lambda b: model(b.inputs, b.targets, loss_reduction="sum"))
        return {"val_loss": (total[0] / total[1].clamp(min=1)).item()}

    return evaluate


def answer_evaluator(convs: Sequence[Conversation], base: BaseModel, dev: Device, max_tokens: int
                     ) -> Callable[[GPT, int], dict[str, float]]:  # fmt: skip
    """Fraction of held-out questions answered right (greedy, through the inference engine)."""
    items = [c for c in convs if c.get("answer") is not None]
    chat_tok = PortachatChatTokenizer(base.tokenizer) if isinstance(base.tokenizer, Tokenizer) else base.tokenizer

    def evaluate(model: GPT, step: int) -> dict[str, float]:
        rank = dist.get_rank() if dist.is_initialized() else 0
        world = dist.get_world_size() if dist.is_initialized() else 1
        mine = items[rank::world]
        right = 0
        if mine:
            was_training = model.training
            prompts = [base.prompt(c["messages"]) for c in mine]
            # A KV cache for these prompts and replies, not for 16 x 2,048 tokens (1.5 GB for SmolLM2 in fp32).
            need = max(len(p) for p in prompts) + max_tokens
            context = min(max(model.config.max_seq_len, need), -(-need // 64) * 64)
            try:  # on a copy in the device's inference dtype (the CPU: the model itself), freed after
                with engine_weights(model, dev) as weights:
                    engine = engine_for(weights, chat_tok, dev, max_num_seqs=min(len(mine), 16), max_model_len=context)
                    model.eval()  # engine_for gives the model back in its mode: no LoRA dropout while answering
                    params = [SamplingParams(max_tokens=max_tokens, temperature=0.0, seed=0) for _ in prompts]
                    done = engine.generate(prompts, params)
                    del engine
            finally:
                model.train(was_training)
            right = sum(is_correct(reply_text(chat_tok, d.token_ids), c["answer"]) for d, c in zip(done, mine, strict=True))
        counts = torch.tensor([right, len(mine)], dtype=torch.int64, device=dev.torch_device)
        if world > 1:
            dist.all_reduce(counts)
        return {"answer_accuracy": counts[0].item() / max(counts[1].item(), 1.0)} if counts[1] > 0 else {}

    return evaluate


# ----------------------------------------------------------------------------- the trainer


class FinetuneTrainer(Trainer):
    """The shared Trainer with fine-tuning's optimizer, and adapter-only checkpoints for LoRA."""

    def __init__(self, *args: Any, lr: float, weight_decay: float, lora: LoraOptions | None, base: BaseModel,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lr, self.weight_decay, self.lora, self.base = lr, weight_decay, lora, base

    def setup(self, resume_from: Path | None = None, init_from: Path | None = None) -> None:
        super().setup()  # placement, DDP, compile; its Muon + AdamW are replaced below
        self.optimizers = [finetune_optimizer(self.model, self.lr, self.weight_decay, self.dev.fused_optimizer)]
        if resume_from is not None:
            if self.lora is not None:
                raise TrainingError(_("--resume of a LoRA fine-tuning run is not supported yet; start it again "
                                      "with --overwrite"))
            rng = self._resume(resume_from)
            if self.start_step > self.cfg.num_iterations:
                raise TrainingError(_("{path} is at step {step}, past this run's horizon of {horizon} steps. "
                                      "Pass a larger --num-iterations.").format(
                    path=resume_from, step=self.start_step, horizon=self.cfg.num_iterations))
            self.step_count = self.start_step
            if rng is not None:
                self.dev.set_rng_state(rng)
            self.say("[portachat] " + _("resumed from {path} at step {step}").format(path=resume_from,
                                                                                    step=self.start_step))

    def save(self, step: int, final: bool) -> Path:
        if self.lora is None:
            return super().save(step, final)
        return self._save_adapter(step, final)

    def run(self, resume_from: Path | None, merge: bool) -> TrainResult:
        """Every fine-tuning stage's end: set up (resuming where asked), train, then `--merge`."""
        self.setup(resume_from=resume_from)
        result = self.fit()
        merge_if_asked(merge, result, self.stage_path, self.model, self.base, self.env, self.say)
        return result

    def _save_adapter(self, step: int, final: bool) -> Path:
        """<stage>/step_N/ with the adapter (PEFT format), the tokenizer, portachat.json and trainer state,
        through the one step-directory writer (every rank agrees before `latest` moves)."""
        env = self.env
        meta = dict(self.meta_base)
        metrics = {**self.metrics, "train_loss": self.last_loss, "total_training_time_s": self.total_time}
        meta.update(step=step, final=final, metrics=metrics, lora=vars(self.lora))
        meta["data_position"] = gather_positions(self.streams, env.rank * self.accum, self.num_streams)
        rngs = gather_rngs(env.rank, self.dev.get_rng_state())
        # Collectives under FSDP2 (every rank gathers its shards), so outside the rank-0-only block.
        tensors = adapter_state_dict(self.model)
        optimizer_state = collect_optimizers(self.model, self.optimizers, None)
        with step_directory(self.stage_path, step, is_main=env.is_main, device=self.dev.torch_device,
                            keep_last=self.cfg.keep_last) as out:
            if env.is_main:
                save_adapter(out.tmp, tensors, self.lora, base_model=str(self.base.path))
                self.tokenizer.save(out.tmp, model_max_length=self.model.config.max_seq_len)
                meta.update(model_config=self.model.config.to_dict(), tokenizer_fingerprint=self.tokenizer.fingerprint())
                (out.tmp / META).write_text(_json(meta), encoding="utf-8")
                write_optimizers(out.tmp, *optimizer_state)
                for r, state in rngs.items():
                    save_rng(out.tmp, r, state)
        final_dir = out.final
        self.say("[portachat] " + _("saved LoRA adapter {path}").format(path=final_dir))
        return final_dir


def _json(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n"


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


def plan_chat_data(stage: str, split: ChatOptions, base: BaseModel, cfg: TrainConfig, dev: Device, env: DistEnv,
                   lr: float, pack: bool, num_epochs: float, num_iterations: int | None,
                   say: Callable[[str], None], loss: LossHook = token_loss,
                   resident: Sequence[torch.nn.Module] = (), describe: str | None = None) -> ChatDataPlan:
    """Split the conversations, warn about rows whose prompt leaves no reply token, settle
    `--device-batch-size auto` (base.model probed as it trains, with the stage's `loss` and the `resident`
    modules it keeps in memory, on the data's widest rows; `describe`: the line saying so) and plan the
    steps: what sft/mid and distillation do before they build their streams."""
    train_convs, val_convs, described = split_conversations(split, cfg.seed)
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

    split = ChatOptions(stage=opts.stage, data=opts.data, max_conversations=opts.max_conversations,
                        eval_examples=opts.eval_examples)
    data = plan_chat_data(opts.stage, split, base, cfg, dev, env, lr, pack, opts.num_epochs, opts.num_iterations, say)
    cfg, train_convs, val_convs, described, bucket, lengths = (
        data.cfg, data.train, data.val, data.described, data.bucket, data.lengths)
    B, T, pad = cfg.device_batch_size, cfg.max_seq_len, pad_id(base.tokenizer)
    evaluators = [val_loss_evaluator(val_convs[: opts.val_conversations], base.render, pad, B, T, dev, bucket)]
    if opts.eval_examples > 0:
        evaluators.append(answer_evaluator(val_convs[: opts.eval_examples], base, dev, opts.eval_max_tokens))
    stage = Stage(
        make_stream=lambda s, n: TemplateChatLoader(train_convs, base.render, pad, B, T, pack=pack, stream=s,
                                                    num_streams=n, seed=cfg.seed, tokens_per_batch=cfg.tokens_per_batch,
                                                    bucket=bucket, length_cache=lengths).prepare(),
        evaluators=evaluators,
    )
    extra = {"data": described, "init_from": str(base.path), "pack": pack, "finetune": "lora" if opts.lora else "full",
             "lr": lr}
    trainer = FinetuneTrainer(model, base.tokenizer, stage, cfg, dev, env, path, extra_meta=extra, print_fn=print_fn,
                              lr=lr, weight_decay=opts.weight_decay, lora=opts.lora, base=base)
    return trainer.run(resume_from, opts.merge)


# ----------------------------------------------------------------------------- the command line


def wants_finetune(args: Any) -> bool:
    """`train mid|sft` fine-tunes when asked for LoRA or when --init names a model that is not ours."""
    if getattr(args, "lora_rank", None) or getattr(args, "merge", False):
        return True
    if not getattr(args, "init", None):
        return False
    return resolve(args.init).format != PORTACHAT


def finetune_options(args: Any, chat: ChatOptions) -> FinetuneOptions:
    """FinetuneOptions from the parsed `train mid|sft` flags (and the ChatOptions made from them)."""
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
