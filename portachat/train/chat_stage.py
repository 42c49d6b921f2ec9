"""Mid-training and SFT: conversations with loss masks on the assistant's tokens, started from the
previous stage's weights (fresh optimizer state), evaluated by answer accuracy while they train.

mid: teaches the chat format and the calculator tool on a mixture of conversations, packed rows.
sft: one conversation per padded row, a lower learning rate decaying to 0, fewer steps.
Either way a batch is padded only to its longest row (portachat.data.chat_loader), and with
--tokens-per-batch its rows are drawn by a token budget instead of a fixed count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from portachat.data.chat_data import (
    Conversation,
    load_conversations,
    synthetic_conversations,
    synthetic_heldout,
)
from portachat.data.chat_loader import (
    ChatLoader,
    iter_chat_val_batches,
    longest_chat_row,
)
from portachat.data.synthetic.tasks import MIXED_TURNS
from portachat.device import Device
from portachat.device.shapes import row_bucket
from portachat.i18n import _
from portachat.model import GPT
from portachat.model.model_dir import read_config
from portachat.tokenizer import Tokenizer, render_conversation, render_for_completion
from portachat.train.chat_eval import answer_accuracy_evaluator
from portachat.train.defaults import STAGE_DEFAULTS
from portachat.train.stage import (  # noqa: F401 - PREVIOUS_STAGE, prepare_stage_dir, start_points: their old home
    PREVIOUS_STAGE,
    begin_stage,
    plan_iterations,
)
from portachat.train.trainer import (
    Stage,
    TrainConfig,
    TrainingError,
    TrainResult,
    resolve_device_batch_size,
    train,
)


@dataclass
class ChatOptions:
    stage: str = "mid"  # "mid" or "sft"
    init: str | None = None  # checkpoint, stage dir or run/stage; None = this run's previous stage, latest
    data: list[str] = field(default_factory=list)  # jsonl/parquet files or dirs; empty = synthetic tasks
    max_conversations: int | None = None  # read at most this many (files) / generate this many (synthetic)
    pack: bool | None = None  # None = the stage's default
    lr_scale: float | None = None  # None = the stage's default
    warmdown_ratio: float | None = None  # None = the stage's default (train.warmdown_ratio is not used)
    num_epochs: float = 1.0  # horizon when num_iterations is not given
    num_iterations: int | None = None
    max_seq_len: int | None = None  # None = the model's context
    eval_examples: int = 64  # held-out conversations answered at each evaluation (0 = none)
    eval_max_tokens: int = 64
    resume: str | None = None  # "auto" = this stage's latest checkpoint, or a path
    overwrite: bool = False
    train: TrainConfig = field(default_factory=TrainConfig)


def model_from_checkpoint(path: Path, dev: Device) -> tuple[GPT, Tokenizer]:
    """A model shaped like the checkpoint's (weights loaded later by the Trainer) and its tokenizer."""
    model_cfg = read_config(path)
    with torch.device(dev.torch_device):
        model = GPT(model_cfg)
    model.init_weights(seed=0)
    return model, Tokenizer.load(path)


def split_conversations(stage: str, data: Sequence[str], max_conversations: int | None, eval_examples: int,
                        seed: int) -> tuple[list[Conversation], list[Conversation], str]:
    """(train, validation, description): files are split 95/5; synthetic tasks use their held-out split."""
    if data:
        convs = load_conversations(list(data), limit=max_conversations)
        n_val = min(500, len(convs) // 20) if len(convs) >= 20 else 0
        val = convs[len(convs) - n_val :] if n_val else convs[:1]  # tiny sets validate on a training row
        return convs[: len(convs) - n_val], val, ", ".join(data)
    n = max_conversations or STAGE_DEFAULTS[stage].synthetic_conversations
    train_convs = synthetic_conversations(n, "train", seed, mixed_turns=MIXED_TURNS)
    val = synthetic_heldout(max(eval_examples, 32))
    return train_convs, val, f"synthetic tasks ({n} conversations)"


def run_chat_stage(opts: ChatOptions, dev: Device | None = None, print_fn=print) -> TrainResult:
    """Train a chat stage (mid or sft) and return its final checkpoint."""
    if opts.stage not in STAGE_DEFAULTS:
        raise TrainingError(_("unknown chat stage {stage}; expected one of {expected}").format(
            stage=repr(opts.stage), expected=sorted(STAGE_DEFAULTS)))
    defaults = STAGE_DEFAULTS[opts.stage]
    start = begin_stage(opts.stage, opts.train, dev, print_fn, resume=opts.resume, overwrite=opts.overwrite,
                        init=opts.init, from_previous=True)
    dev, env, say, cfg, path = start.dev, start.env, start.say, start.cfg, start.path
    resume_from, init_from = start.resume_from, start.init_from
    model, tokenizer = model_from_checkpoint(resume_from or init_from, dev)
    cfg = replace(cfg, max_seq_len=opts.max_seq_len or model.config.max_seq_len)
    train_convs, val_convs, described = split_conversations(opts.stage, opts.data, opts.max_conversations,
                                                            opts.eval_examples, cfg.seed)
    bucket = row_bucket(dev.type, dev.compile)
    pack = defaults.pack if opts.pack is None else opts.pack

    render = lambda m, n: render_conversation(tokenizer, m, n)  # noqa: E731
    lengths: dict[int, int] = {}  # rendered lengths, shared by `auto`'s probe width, the planner and every stream
    cfg = resolve_device_batch_size(cfg, model, dev, env, say, row_len=lambda: longest_chat_row(
        train_convs, render, cfg.max_seq_len, bucket, pack, lengths))
    scale = defaults.lr_scale if opts.lr_scale is None else opts.lr_scale
    cfg = replace(cfg, muon_momentum_warmup=0, optim=cfg.optim.scaled(scale),
                  warmdown_ratio=defaults.warmdown_ratio if opts.warmdown_ratio is None else opts.warmdown_ratio)

    rows = _("packed rows") if pack else _("padded rows")
    say(f"[portachat] {opts.stage}: " + _("{n} training conversations from {source} ({rows}), {held} held out").format(
        n=len(train_convs), source=described, rows=rows, held=len(val_convs)))
    if not opts.data:
        say("[portachat] " + _("NOTE: no --data given: training on the built-in SYNTHETIC task conversations (offline)."))
    say(f"[portachat] {opts.stage}: " + _("starting from {path}").format(path=init_from or resume_from))
    streams = env.world_size * cfg.grad_accum_steps(env.world_size)
    if opts.num_iterations is not None:
        cfg = replace(cfg, num_iterations=opts.num_iterations)
    else:
        cfg = replace(cfg, num_iterations=plan_iterations(train_convs, render, cfg, pack, opts.num_epochs, streams,
                                                          bucket, lengths))

    B, T = cfg.device_batch_size, cfg.max_seq_len
    max_val_batches = max(1, cfg.eval_tokens // (B * T))
    evaluators = []
    if opts.eval_examples > 0:
        name = "heldout_accuracy" if not opts.data else "val_accuracy"
        evaluators.append(answer_accuracy_evaluator(val_convs[: opts.eval_examples], tokenizer,
                                                    lambda m: render_for_completion(tokenizer, m), dev, env,
                                                    opts.eval_max_tokens, name=name))
    stage = Stage(
        make_stream=lambda s, n: ChatLoader(train_convs, tokenizer, B, T, pack=pack, stream=s, num_streams=n,
                                            seed=cfg.seed, tokens_per_batch=cfg.tokens_per_batch, bucket=bucket,
                                            length_cache=lengths).prepare(),
        val_batches=lambda rank, world: iter_chat_val_batches(val_convs, tokenizer, B, T, rank, world, max_val_batches,
                                                              bucket=bucket),
        evaluators=evaluators,
    )
    extra = {"data": described, "init_from": start.origin(), "pack": pack, "lr_scale": scale}
    return train(model, tokenizer, stage, cfg, dev, env, path, resume_from=resume_from, init_from=init_from,
                 extra_meta=extra, print_fn=print_fn)
