"""Distillation: a student trained to match a teacher's next-token distributions (`portachat distill`).

The student is any model fine-tuning takes (`--student`: an HF directory, a GGUF, one of our
checkpoints; full or LoRA), or the teacher itself cut to fewer layers (`--student-depth N`,
train/student.py). The two must share a vocabulary, checked token for token before any data is read
or any stage directory is touched. The teacher runs in this process (train/teacher.py).

Each micro-batch is either conversations from the data (off-policy: the loss covers the assistant's
tokens, the cross-entropy term uses them as labels) or, with probability λ (`--on-policy`), replies the
student itself samples through our inference engine for the same prompts (on-policy, GKD: the student
learns from the teacher's view of its own mistakes; no cross-entropy on them, they are no labels).
The loss is distill_loss.py's τ² · D_β + α · CE, summed per supervised token and normalised by the
shared Trainer like every stage's. Optimizer, checkpoints (an HF directory, or a PEFT adapter and
`--merge`), resume and multi-device runs are fine-tuning's (train/finetune.py).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from portachat.data.batch import Batch
from portachat.data.chat_data import Conversation
from portachat.data.chat_loader import Bucket, rows_to_batch
from portachat.device import Device, DistEnv
from portachat.device.policy import finetune_activation_checkpointing
from portachat.device.shapes import pad_bucket
from portachat.eval.generation import as_chat_tokenizer
from portachat.i18n import _
from portachat.model import GPT
from portachat.model.load import load_for_inference
from portachat.model.loss import loss_chunk_size
from portachat.model.source import resolve
from portachat.train.base_model import BaseModel, load_base, pad_id
from portachat.train.chat_eval import held_out_sums, val_loss_evaluator
from portachat.train.chat_stage import split_conversations
from portachat.train.distill_loss import DistillLoss, TeacherTargets, distill_loss_sum
from portachat.train.finetune import (
    FULL_LR,
    LORA_LR,
    TemplateChatLoader,
    fit_finetune,
    plan_chat_data,
)
from portachat.train.hooks import Evaluator
from portachat.train.lora import LoraOptions, add_lora
from portachat.train.rollout import Rollout
from portachat.train.stage import Render, begin_stage
from portachat.train.student import student_from_teacher
from portachat.train.teacher import (
    InProcessTeacher,
    RemoteTeacher,
    check_shared_vocabulary,
    is_remote,
    supervised_indices,
)
from portachat.train.trainer import Stage, TrainConfig, TrainingError, TrainResult

STAGE = "distill"


@dataclass
class DistillOptions:
    teacher: str  # HF directory, .gguf file, our checkpoint, or http(s)://HOST:PORT of a server scoring prompts
    teacher_model: str | None = None  # a remote teacher: the served model's name (None = the server's first)
    student: str | None = None  # a model of the teacher's vocabulary ...
    student_depth: int | None = None  # ... or the teacher cut to this many layers
    data: list[str] = field(default_factory=list)  # conversations; empty = the built-in synthetic tasks
    max_conversations: int | None = None
    loss: DistillLoss = field(default_factory=DistillLoss)
    on_policy: float = 0.0  # λ: share of micro-batches the student samples itself
    max_new_tokens: int = 64  # on-policy reply length
    sample_temperature: float = 1.0  # the student's sampling temperature on-policy
    lr: float | None = None  # None = FULL_LR or LORA_LR
    weight_decay: float = 0.0
    num_epochs: float = 1.0
    num_iterations: int | None = None
    max_seq_len: int | None = None  # None = min(the student's context, 2048)
    val_conversations: int = 64
    lora: LoraOptions | None = None
    merge: bool = False
    activation_checkpointing: bool | None = None
    resume: str | None = None
    overwrite: bool = False
    train: TrainConfig = field(default_factory=TrainConfig)

    def check(self) -> None:
        if (self.student is None) == (self.student_depth is None):
            raise TrainingError(_("distillation needs a student: pass --student MODEL or --student-depth N (one of them)"))
        if self.student_depth is not None and self.lora is not None:
            raise TrainingError(_("--student-depth builds a new model whose weights all train: a LoRA adapter would "
                                  "need a base model that exists nowhere. Drop --lora-rank, or distill into an "
                                  "existing --student with it."))
        if self.student_depth is not None and is_remote(self.teacher):
            raise TrainingError(_("--student-depth cuts the teacher's own layers: it needs the teacher in this process "
                                  "(a model path), not a server. Pass --student MODEL with a remote teacher."))
        if self.merge and self.lora is None:
            raise TrainingError(_("--merge folds a LoRA adapter into the model: pass --lora-rank R with it"))
        if not 0.0 <= self.on_policy <= 1.0:
            raise TrainingError(_("--on-policy is the share of micro-batches the student samples itself: between 0 "
                                  "and 1, got {value}").format(value=self.on_policy))
        try:
            self.loss.check()
        except ValueError as exc:
            raise TrainingError(str(exc)) from exc


# ----------------------------------------------------------------------------- the loss hook


class DistillHook:
    """The Stage's loss: the teacher scores the batch, the student's head runs a chunk at a time."""

    def __init__(self, student: GPT, teacher: InProcessTeacher | RemoteTeacher, loss: DistillLoss) -> None:
        self.student, self.teacher, self.loss = student, teacher, loss
        self.chunk = loss_chunk_size(student.config.vocab_size)

    def __call__(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        keep = supervised_indices(batch)
        targets = self.teacher.targets(batch, self.loss)
        hidden = model(batch.inputs, positions=batch.positions, hidden_only=True)  # through DDP's forward
        picked = hidden.reshape(-1, hidden.size(-1)).index_select(0, keep)
        labels = batch.targets.reshape(-1).index_select(0, keep)
        weights = None if batch.weights is None else batch.weights.reshape(-1).index_select(0, keep)
        return distill_loss_sum(picked, self.student.lm_head, targets, labels, weights, self.loss, self.chunk)


def kd_evaluator(convs: Sequence[Conversation], render: Render, pad: int, batch_size: int, seq_len: int, dev: Device,
                 env: DistEnv, hook: DistillHook, bucket: Bucket = pad_bucket) -> Evaluator:
    """Mean distillation loss per supervised token on held-out conversations (every rank its share)."""

    def evaluate(model: GPT, step: int) -> dict[str, float]:
        was_training = model.training
        model.eval()
        try:
            total = held_out_sums(convs, render, pad, batch_size, seq_len, dev, env, bucket, lambda b: hook(model, b))
        finally:
            model.train(was_training)
        if total[1] == 0:  # no held-out reply token fits --max-seq-len: nothing measured, nothing to log
            return {}
        return {"val_kd": (total[0] / total[1]).item()}

    return evaluate


# ----------------------------------------------------------------------------- on-policy batches


def reply_prompts(convs: Sequence[Conversation], base: BaseModel) -> list[list[int]]:
    """Each conversation's prompt for its last assistant reply (the turns before it)."""
    prompts = []
    for conv in convs:
        messages = conv["messages"]
        last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
        if last:
            prompts.append(base.prompt(messages[:last]))
    return prompts


class OnPolicyStream:
    """The data's batches, each replaced with probability λ by replies the student samples itself.

    The coin for a batch is drawn from (seed, stream, batch number), so a resumed run makes the same
    choices; the state is the inner loader's plus those counters."""

    def __init__(self, inner: TemplateChatLoader, prompts: list[list[int]], rollout: Rollout, opts: DistillOptions,
                 pad: int, batch_size: int, seq_len: int, bucket: Bucket, stream: int, num_streams: int,
                 seed: int) -> None:  # fmt: skip
        self.inner, self.rollout, self.opts = inner, rollout, opts
        self.pad, self.batch_size, self.seq_len, self.bucket = pad, batch_size, seq_len, bucket
        self.prompts = [p for p in prompts[stream::num_streams] if len(p) < seq_len] or \
            [p for p in prompts if len(p) < seq_len]
        self.stream, self.seed = stream, seed
        self.count = 0  # batches given so far
        self.index = 0  # prompts sampled so far

    def next_batch(self) -> Batch:
        self.count += 1
        coin = random.Random((self.seed * 1_000_003 + self.stream) * 1_000_003 + self.count).random()
        if coin >= self.opts.on_policy or not self.prompts:
            return self.inner.next_batch()
        picked = [self.prompts[(self.index + k) % len(self.prompts)] for k in range(self.batch_size)]
        self.index += self.batch_size
        base_seed = (self.seed * 7919 + self.stream) * 1_000_003 + self.index
        # The rollout engine's context is seq_len + 1: each reply fills at most what its row leaves.
        replies = self.rollout.sample(picked, self.opts.max_new_tokens, self.opts.sample_temperature,
                                      seeds=[base_seed + k for k in range(len(picked))])
        self.rollout.sleep()  # the KV cache's memory is the trainer's until the next sampled batch
        rows = [(list(p) + r.token_ids, [0] * len(p) + [1] * len(r.token_ids))
                for p, r in zip(picked, replies, strict=True)]
        batch = rows_to_batch(rows, self.pad, self.seq_len, self.bucket)
        batch.weights = torch.zeros(batch.targets.shape)  # CE weight 0: the student's own tokens are no labels
        return batch

    def state_dict(self) -> dict:
        return {"inner": self.inner.state_dict(), "count": self.count, "index": self.index}

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state["inner"])
        self.count, self.index = int(state["count"]), int(state["index"])


class ProbeTeacher:
    """A remote teacher's answer without asking it, for the batch-size probe: top-k log-probabilities of
    every supervised position (what a server sends back is all it costs this device)."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def targets(self, batch: Batch, loss: DistillLoss) -> TeacherTargets:
        n, k = supervised_indices(batch).numel(), loss.top_k or self.vocab_size
        device = batch.inputs.device
        ids = torch.randint(0, self.vocab_size, (n, k), device=device) if loss.top_k else None
        return TeacherTargets(torch.full((n, k), -math.log(k), device=device), ids)


# ----------------------------------------------------------------------------- the stage


def load_teacher(opts: DistillOptions, dev: Device) -> tuple[InProcessTeacher | RemoteTeacher, Any]:
    """The teacher (in this process: on the training device in the device's compute dtype) and its
    tokenizer (None for a remote one: its vocabulary is checked through the server)."""
    if is_remote(opts.teacher):
        return RemoteTeacher(opts.teacher, opts.teacher_model), None
    loaded = load_for_inference(resolve(opts.teacher), device=dev.torch_device, dtype=dev.dtype)
    return InProcessTeacher(loaded.model, str(loaded.path)), loaded.tokenizer


def make_student(opts: DistillOptions, teacher: InProcessTeacher | RemoteTeacher, teacher_tokenizer: Any,
                 dev: Device) -> BaseModel:  # fmt: skip
    """The student, its vocabulary checked against the teacher's (before any data is read)."""
    if opts.student is not None:
        base = load_base(opts.student, dev)
        if isinstance(teacher, RemoteTeacher):
            teacher.check_vocabulary(as_chat_tokenizer(base.tokenizer), base.model.config.vocab_size, str(base.path))
        else:
            check_shared_vocabulary(teacher.model, teacher_tokenizer, teacher.name, base.model,
                                    as_chat_tokenizer(base.tokenizer), str(base.path))
        return base
    base = load_base(opts.teacher, dev)  # fp32 and trainable, with the teacher's tokenizer and template
    base.model = student_from_teacher(base.model, opts.student_depth)
    base.model.requires_grad_(True)
    return base


def run_distill(opts: DistillOptions, dev: Device | None = None, print_fn=print) -> TrainResult:
    """Distill `opts.teacher` into the student and return the final checkpoint (the adapter, for LoRA)."""
    opts.check()
    start = begin_stage(STAGE, opts.train, dev, print_fn, resume=opts.resume, overwrite=opts.overwrite)
    dev, env, say, cfg, path, resume_from = start.dev, start.env, start.say, start.cfg, start.path, start.resume_from
    teacher, teacher_tokenizer = load_teacher(opts, dev)
    base = make_student(opts, teacher, teacher_tokenizer, dev)
    model = base.model
    if opts.lora is not None:
        add_lora(model, opts.lora)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    loss = opts.loss
    say(f"[portachat] {STAGE}: " + _("teacher {teacher} ({t_layers} layers) -> student {student} ({s_layers} layers, "
                                     "{mode}; {trainable} parameters train)").format(
        teacher=teacher.name, t_layers=teacher.model.config.n_layer if isinstance(teacher, InProcessTeacher) else "?",
        student=opts.student or _("the teacher cut to {n} layers").format(n=opts.student_depth),
        s_layers=model.config.n_layer, mode=_("LoRA r={rank}").format(rank=opts.lora.rank) if opts.lora else _("full"),
        trainable=f"{trainable:,}"))
    say(f"[portachat] {STAGE}: " + _("loss = τ² · D_β + α · CE with β={beta:g}, τ={tau:g}, α={alpha:g}, teacher "
                                     "{top}; on-policy share λ={share:g}").format(
        beta=loss.beta, tau=loss.temperature, alpha=loss.alpha, share=opts.on_policy,
        top=_("top-{k}").format(k=loss.top_k) if loss.top_k else _("full vocabulary")))
    ac = opts.activation_checkpointing
    cfg = replace(cfg, max_seq_len=opts.max_seq_len or min(model.config.max_seq_len, 2048),
                  activation_checkpointing=finetune_activation_checkpointing(dev.type) if ac is None else ac)
    lr = opts.lr if opts.lr is not None else (LORA_LR if opts.lora else FULL_LR)

    split = split_conversations("sft", opts.data, opts.max_conversations, 0, cfg.seed)
    # `--device-batch-size auto` probes the teacher's forward too (a remote one's answer takes only its top k)
    in_process = isinstance(teacher, InProcessTeacher)
    hook = DistillHook(model, teacher, loss)
    probe = hook if in_process else DistillHook(model, ProbeTeacher(model.config.vocab_size), loss)
    data = plan_chat_data(STAGE, split, base, cfg, dev, env, lr, False, opts.num_epochs, opts.num_iterations, say,
                          loss=probe, resident=[teacher.model] if in_process else [],
                          describe=_("--device-batch-size auto probes rows of {n} tokens, the teacher's forward "
                                     "included: the data's longest, padded (--max-seq-len {seq_len})"))
    cfg, train_convs, val_convs, described, bucket, lengths = (
        data.cfg, data.train, data.val, data.described, data.bucket, data.lengths)
    B, T, pad = cfg.device_batch_size, cfg.max_seq_len, pad_id(base.tokenizer)
    val = val_convs[: opts.val_conversations]
    prompts = reply_prompts(train_convs, base) if opts.on_policy > 0 else []
    rollout = Rollout(model, base.tokenizer, dev, max_num_seqs=B, max_model_len=T + 1, lora=opts.lora is not None)

    def make_stream(s: int, n: int) -> Any:
        inner = TemplateChatLoader(train_convs, base.render, pad, B, T, pack=False, stream=s, num_streams=n,
                                   seed=cfg.seed, tokens_per_batch=cfg.tokens_per_batch, bucket=bucket,
                                   length_cache=lengths).prepare()
        if opts.on_policy == 0:
            return inner
        return OnPolicyStream(inner, prompts, rollout, opts, pad, B, T, bucket, s, n, cfg.seed)

    stage = Stage(make_stream=make_stream, loss=hook,
                  evaluators=[kd_evaluator(val, base.render, pad, B, T, dev, env, hook, bucket),
                              val_loss_evaluator(val, base.render, pad, B, T, dev, env, bucket)])
    extra = {"data": described, "teacher": teacher.name, "init_from": str(base.path),
             "student": opts.student or {"depth": opts.student_depth, "from": teacher.name},
             "distill": {**asdict(loss), "on_policy": opts.on_policy}, "finetune": "lora" if opts.lora else "full",
             "lr": lr}
    return fit_finetune(model, base, stage, cfg, dev, env, path, lr=lr, weight_decay=opts.weight_decay, lora=opts.lora,
                        merge=opts.merge, resume_from=resume_from, extra_meta=extra, print_fn=print_fn)
