"""Preference alignment (DPO, IPO, SimPO, ORPO) of any model `--init` loads, full or LoRA, on the shared Trainer.

The model, its tokenizer and chat template, the optimizer (AdamW at fine-tuning rates), LoRA, adapter
checkpoints and `--merge` are fine-tuning's (portachat.train.finetune); this module adds the pairs
(portachat.data.preference_data), the losses (portachat.train.preference_loss) and the reference:
  - LoRA: the same weights with the adapter switched off, a no-grad forward each step (no second copy);
  - full fine-tuning (or `--reference cache`): the reference log-probs of every pair, computed once
    before the first step by the initial weights and carried in the batches (a forward per pair, no copy).
A step's loss is the mean over its pairs (the Trainer divides the summed pair losses by the global pair
count). TRL's metrics are logged every step: rewards/chosen, rewards/rejected, rewards/accuracies,
rewards/margins, logps/chosen, logps/rejected; evaluations add the same on held-out pairs (eval/...) and,
for pairs with a verifiable answer, how often the model answers them right (eval/answer_accuracy).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

from portachat.data.batch import Batch
from portachat.data.preference_data import (
    PreferenceBatch,
    PreferenceLoader,
    PreferencePair,
    all_pair_batches,
    load_pairs,
    pair_rows,
    trainable,
)
from portachat.device import Device, DistEnv
from portachat.device.policy import finetune_activation_checkpointing
from portachat.device.shapes import row_bucket
from portachat.i18n import _
from portachat.train.base_model import load_base, pad_id
from portachat.train.chat_eval import answer_accuracy_evaluator
from portachat.train.collectives import SINGLE_PROCESS, sum_over_ranks
from portachat.train.finetune import FULL_LR, fit_finetune
from portachat.train.finetune_batch import probe_rows, resolve_finetune_batch_size
from portachat.train.hooks import Evaluator
from portachat.train.lora import LoraOptions, adapters_disabled, add_lora
from portachat.train.preference_loss import (
    DEFAULT_BETA,
    LOSSES,
    NEEDS_REFERENCE,
    SIMPO_GAMMA,
    PreferenceMetrics,
    preference_loss,
    sequence_logps,
)
from portachat.train.stage import begin_stage
from portachat.train.trainer import Stage, TrainConfig, TrainingError, TrainResult

STAGE = "dpo"
LORA_LR = 5e-5  # DPO moves a model less than SFT does: TRL's DPO examples use 5e-6 full and ~5e-5 LoRA
DPO_FULL_LR = FULL_LR / 4  # 5e-6
REFERENCES = ("auto", "live", "cache")


@dataclass
class DPOOptions:
    init: str  # HF directory, .gguf file, or our checkpoint
    data: list[str] = field(default_factory=list)  # preference files (TRL layouts)
    loss: str = "dpo"  # dpo | ipo | simpo | orpo
    beta: float | None = None  # None = DEFAULT_BETA[loss]
    gamma: float = SIMPO_GAMMA  # SimPO's target margin
    reference: str = "auto"  # live (LoRA: adapter off) | cache (log-probs computed once) | auto
    max_pairs: int | None = None
    val_pairs: int = 64  # held out for eval/rewards/*; a set under 20 pairs holds none out
    lr: float | None = None  # None = DPO_FULL_LR or LORA_LR
    weight_decay: float = 0.0
    num_epochs: float = 1.0
    num_iterations: int | None = None
    max_seq_len: int | None = None  # None = min(the model's context, 1024)
    eval_examples: int = 16  # held-out prompts with answers answered at each evaluation (0 = none)
    eval_max_tokens: int = 64
    lora: LoraOptions | None = None
    merge: bool = False
    activation_checkpointing: bool | None = None
    resume: str | None = None
    overwrite: bool = False
    train: TrainConfig = field(default_factory=TrainConfig)


def split_pairs(pairs: Sequence[PreferencePair], val_pairs: int, seed: int
                ) -> tuple[list[PreferencePair], list[PreferencePair]]:  # fmt: skip
    """(train, held out): a seeded shuffle, at most `val_pairs` (and a tenth of the set) held out."""
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    n_val = min(val_pairs, len(pairs) // 10) if len(pairs) >= 20 else 0
    return [pairs[i] for i in order[n_val:]], [pairs[i] for i in order[:n_val]]


def pair_count(batch: PreferenceBatch) -> torch.Tensor:
    return torch.tensor(float(batch.num_pairs), device=batch.inputs.device)


@torch.no_grad()
def reference_logps(model: torch.nn.Module, pairs: Sequence[PreferencePair], base: Any, seq_len: int, batch_size: int,
                    dev: Device, bucket: Callable[[int, int], int], env: DistEnv = SINGLE_PROCESS) -> torch.Tensor:
    """[N, 2] summed log-probs (chosen, rejected) of every pair under `model` as it is now (adapters off);
    each rank scores its share, one all-reduce gives every rank the whole table."""
    rank, world = env.rank, env.world_size
    out = torch.zeros(len(pairs), 2, dtype=torch.float32, device=dev.torch_device)
    was_training = model.training
    model.eval()
    try:
        with adapters_disabled(model):
            for batch in all_pair_batches(pairs, base.render, base.prompt, pad_id(base.tokenizer), batch_size, seq_len,
                                          range(rank, len(pairs), world), bucket):
                index = batch.pair_index.to(dev.torch_device)
                batch = batch.to(dev.torch_device)
                with dev.autocast():
                    logps, _counts = sequence_logps(model, batch)
                out[index] = logps.float().view(2, -1).t()
    finally:
        model.train(was_training)
    return sum_over_ranks(out, env).cpu()


class PreferenceObjective:
    """The stage's loss hook: the policy's log-probs, the reference's (cached in the batch, or the same
    model with its adapter off), the chosen loss; TRL's metrics summed on the device."""

    def __init__(self, kind: str, beta: float, gamma: float, reference_model: torch.nn.Module | None,
                 metrics: PreferenceMetrics) -> None:  # fmt: skip
        self.kind, self.beta, self.gamma = kind, beta, gamma
        self.reference_model = reference_model  # the raw model (not DDP's wrapper): a no-grad forward
        self.metrics = metrics

    def scores(self, model: torch.nn.Module, batch: PreferenceBatch):
        ref = batch.ref_logps
        if ref is None and self.kind in NEEDS_REFERENCE:
            with torch.no_grad(), adapters_disabled(self.reference_model):
                ref, _n = sequence_logps(self.reference_model, batch)
        logps, counts = sequence_logps(model, batch)
        p = batch.num_pairs
        refs = (ref[:p].float(), ref[p:].float()) if ref is not None else (None, None)
        scores = preference_loss(self.kind, self.beta, logps[:p].float(), logps[p:].float(), counts[:p], counts[p:],
                                 *refs, gamma=self.gamma)
        return scores, logps[:p], logps[p:]

    def __call__(self, model: torch.nn.Module, batch: PreferenceBatch) -> torch.Tensor:
        scores, chosen, rejected = self.scores(model, batch)
        self.metrics.add(scores, chosen, rejected)
        return scores.losses.sum()


def preference_evaluator(objective: PreferenceObjective, pairs: Sequence[PreferencePair], base: Any, seq_len: int,
                         batch_size: int, dev: Device, env: DistEnv, bucket: Callable[[int, int], int],
                         ref_logps: torch.Tensor | None) -> Evaluator:  # fmt: skip
    """TRL's reward metrics and the loss on held-out pairs (every rank its share)."""

    @torch.no_grad()
    def evaluate(model: Any, step: int) -> dict[str, float]:
        rank, world = env.rank, env.world_size
        metrics = PreferenceMetrics(dev.torch_device, dev.accumulate_dtype, env)
        judge = PreferenceObjective(objective.kind, objective.beta, objective.gamma, model, metrics)
        loss = torch.zeros((), dtype=dev.accumulate_dtype, device=dev.torch_device)
        for batch in all_pair_batches(pairs, base.render, base.prompt, pad_id(base.tokenizer), batch_size, seq_len,
                                      range(rank, len(pairs), world), bucket):
            if ref_logps is not None:
                batch.ref_logps = ref_logps[batch.pair_index].t().reshape(-1)
            batch = batch.to(dev.torch_device)
            with dev.autocast():
                loss += judge(model, batch).to(loss.dtype)
        loss = sum_over_ranks(loss, env)
        return {"loss": loss.item() / max(len(pairs), 1), **metrics.read()}

    return evaluate


def _drop_untrainable(pairs: list[PreferencePair], base: Any, seq_len: int, say: Callable[[str], None]
                      ) -> list[PreferencePair]:  # fmt: skip
    kept = [p for p in pairs if trainable(pair_rows(p, base.render, base.prompt, seq_len + 1))]
    if len(kept) < len(pairs):
        say("[portachat] " + _("WARNING: {n} of {total} pairs have a reply with no token within --max-seq-len "
                               "{seq_len} (the prompt fills the row); they are left out. Raise --max-seq-len.").format(
            n=len(pairs) - len(kept), total=len(pairs), seq_len=seq_len))
    if not kept:
        raise TrainingError(_("no preference pair has a reply within --max-seq-len {seq_len}: raise "
                              "--max-seq-len").format(seq_len=seq_len))
    return kept


def longest_pair_row(pairs: Sequence[PreferencePair], base: Any, seq_len: int, bucket: Callable[[int, int], int],
                     rows: dict[int, Any]) -> int:
    """The widest batch the pairs make: their longest chosen or rejected row's bucket. Every pair rendered
    goes into `rows`, the cache the stage's loaders share."""
    longest = 1
    for i, pair in enumerate(pairs):
        if i not in rows:
            rows[i] = pair_rows(pair, base.render, base.prompt, seq_len + 1)
        longest = max(longest, *(min(len(ids), seq_len + 1) - 1 for ids, _mask in rows[i]))
    return bucket(longest, seq_len)


def probe_pairs(pairs: int, width: int, vocab_size: int, cached: bool) -> PreferenceBatch:
    """`pairs` pairs of probe rows (finetune_batch.probe_rows), with cached reference log-probs if the stage has them."""
    rows = probe_rows(2 * pairs, width, vocab_size)
    return PreferenceBatch(**{f.name: getattr(rows, f.name) for f in fields(Batch)}, pair_index=torch.arange(pairs),
                           ref_logps=torch.zeros(2 * pairs) if cached else None)


def run_dpo(opts: DPOOptions, dev: Device | None = None, print_fn=print) -> TrainResult:
    """Align `opts.init` on preference pairs (full or LoRA) and return the final checkpoint."""
    if opts.loss not in LOSSES:
        raise TrainingError(_("--loss {loss}: expected one of {losses}").format(loss=opts.loss, losses=", ".join(LOSSES)))
    if opts.reference not in REFERENCES:
        raise TrainingError(_("--reference {ref}: expected one of {refs}").format(ref=opts.reference,
                                                                                 refs=", ".join(REFERENCES)))
    if opts.merge and opts.lora is None:
        raise TrainingError(_("--merge folds a LoRA adapter into the model: pass --lora-rank R with it"))
    if not opts.data:
        raise TrainingError(_("train dpo needs --data: a jsonl/parquet file of preference pairs (prompt, chosen, "
                              "rejected). Make one from the model's own answers with `portachat train prefs`."))
    start = begin_stage(STAGE, opts.train, dev, print_fn, resume=opts.resume, overwrite=opts.overwrite)
    dev, env, say, cfg, path, resume_from = start.dev, start.env, start.say, start.cfg, start.path, start.resume_from
    base = load_base(opts.init, dev)
    model = base.model
    cfg = replace(cfg, max_seq_len=opts.max_seq_len or min(model.config.max_seq_len, 1024))
    beta = opts.beta if opts.beta is not None else DEFAULT_BETA[opts.loss]
    pairs = load_pairs(opts.data, limit=opts.max_pairs)
    train_pairs, val_pairs = split_pairs(pairs, opts.val_pairs, cfg.seed)
    train_pairs = _drop_untrainable(train_pairs, base, cfg.max_seq_len, say)
    bucket = row_bucket(dev.type, dev.compile)
    needs_ref = opts.loss in NEEDS_REFERENCE
    cached = needs_ref and (opts.lora is None or opts.reference == "cache")
    if opts.reference == "live" and opts.lora is None and needs_ref:
        raise TrainingError(_("--reference live needs --lora-rank (the reference is the model with its adapter off); "
                              "full fine-tuning uses --reference cache"))
    if opts.lora is not None:  # before `auto` probes the model as it trains (the cached reference runs it off)
        add_lora(model, opts.lora)
    ac = opts.activation_checkpointing
    cfg = replace(cfg, activation_checkpointing=finetune_activation_checkpointing(dev.type) if ac is None else ac)
    rows: dict[int, Any] = {}  # rendered pairs, shared by every stream of this process
    probe = PreferenceObjective(opts.loss, beta, opts.gamma, model, PreferenceMetrics(dev.torch_device,
                                                                                      dev.accumulate_dtype))
    cfg = resolve_finetune_batch_size(
        cfg, model, dev, env, say, lambda: longest_pair_row(train_pairs, base, cfg.max_seq_len, bucket, rows),
        most=len(train_pairs), make_batch=lambda b, w: probe_pairs(b, w, model.config.vocab_size, cached), loss=probe,
        describe=_("--device-batch-size auto probes pairs (a chosen and a rejected row) of {n} tokens each: the "
                   "data's longest, padded (--max-seq-len {seq_len})"),
        chosen=_("--device-batch-size auto: {batch} pairs (twice as many rows) per device, {accum} accumulation "
                 "step(s)"), rows_per_example=2)
    B = int(cfg.device_batch_size)  # pairs per micro-batch: 2B rows
    train_ref = val_ref = None
    if cached:  # before any step: the initial weights (adapter off) are the reference
        say(f"[portachat] {STAGE}: " + _("reference log-probs of {n} pairs computed once (no second model in "
                                         "memory)").format(n=len(train_pairs) + len(val_pairs)))
        train_ref = reference_logps(model, train_pairs, base, cfg.max_seq_len, B, dev, bucket, env)
        val_ref = reference_logps(model, val_pairs, base, cfg.max_seq_len, B, dev, bucket, env) if val_pairs else None
    lr = opts.lr if opts.lr is not None else (LORA_LR if opts.lora else DPO_FULL_LR)
    streams = env.world_size * cfg.grad_accum_steps(env.world_size)
    cfg = replace(cfg, num_iterations=opts.num_iterations or max(
        1, math.ceil(opts.num_epochs * len(train_pairs) / (B * streams))))
    trainable_n = sum(p.numel() for p in model.parameters() if p.requires_grad)
    reference = (_("none") if not needs_ref else _("cached log-probs") if cached else _("the model with its adapter off"))
    say(f"[portachat] {STAGE}: " + _("{loss} (beta {beta}) on {n} pairs from {source}, {held_out} held out; "
                                     "reference: {reference}; {trainable} parameters train; AdamW lr {lr}").format(
        loss=opts.loss, beta=f"{beta:g}", n=len(train_pairs), source=", ".join(opts.data), held_out=len(val_pairs),
        reference=reference, trainable=f"{trainable_n:,}", lr=f"{lr:g}"))

    metrics = PreferenceMetrics(dev.torch_device, dev.accumulate_dtype, env)
    objective = PreferenceObjective(opts.loss, beta, opts.gamma, model, metrics)
    pad = pad_id(base.tokenizer)
    evaluators = []
    if val_pairs:
        evaluators.append(preference_evaluator(objective, val_pairs, base, cfg.max_seq_len, B, dev, env, bucket,
                                               val_ref))
    answered = [{"messages": p.prompt, "answer": p.answer} for p in val_pairs if p.answer is not None]
    if opts.eval_examples > 0 and answered:
        evaluators.append(answer_accuracy_evaluator(answered[: opts.eval_examples], base.tokenizer, base.prompt, dev,
                                                    env, opts.eval_max_tokens, name="answer_accuracy"))
    stage = Stage(
        make_stream=lambda s, n: PreferenceLoader(train_pairs, base.render, base.prompt, pad, B, cfg.max_seq_len,
                                                  stream=s, num_streams=n, seed=cfg.seed, bucket=bucket,
                                                  ref_logps=train_ref, row_cache=rows),
        loss=objective,
        evaluators=evaluators,
        step_metrics=metrics.read,
        count=pair_count,
    )
    extra = {"data": ", ".join(opts.data), "init_from": str(base.path), "finetune": "lora" if opts.lora else "full",
             "lr": lr, "preference": {"loss": opts.loss, "beta": beta, "gamma": opts.gamma,
                                      "reference": "cache" if cached else ("live" if needs_ref else "none")}}
    return fit_finetune(model, base, stage, cfg, dev, env, path, lr=lr, weight_decay=opts.weight_decay, lora=opts.lora,
                        merge=opts.merge, resume_from=resume_from, extra_meta=extra, print_fn=print_fn)
