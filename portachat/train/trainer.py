"""The Trainer every stage shares (base, mid, sft, rl).

A stage supplies the model, the tokenizer and a `Stage`: its data streams, a loss hook, evaluators.
The Trainer owns everything else: device placement, data parallelism, gradient accumulation, mixed
precision, schedules, the NaN guard, evaluation, logging, checkpoints and exact resume.

Loss normalisation: a loss hook returns the SUMMED loss of a micro-batch; the Trainer divides by the
number of supervised tokens of the whole optimizer step, counted over every micro-batch and every
rank before the first backward. So a masked batch weighs each supervised token equally however the
batch is split across accumulation steps and devices.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from portachat.checkpoint import save_checkpoint
from portachat.checkpoint.sharded import whole_copy
from portachat.checkpoint.trainer_state import load_optimizers, load_rng
from portachat.data.batch import Batch, as_batch
from portachat.data.prefetch import PrefetchStream
from portachat.device import Device, DistEnv
from portachat.device.flops import attention_flops_per_token
from portachat.device.telemetry import TelemetryMonitor
from portachat.eval.bpb import evaluate_bpb
from portachat.i18n import _
from portachat.i18n.width import display_width
from portachat.model import GPT
from portachat.model.model_dir import check_tokenizer_matches, load_weights_into, read_config, read_meta
from portachat.tokenizer import Tokenizer
from portachat.train.accumulation import TrainingError, grad_accum_steps
from portachat.train.hot_path import (
    MFU_ATTENTION,
    causal_flops_per_token,
    choose_attention,
    clip_with_norm,
    collect_garbage,
    device_grad_norm,
    freeze_gc,
    readable,
    thaw_gc,
)
from portachat.train.logger import RunLogger, format_progress
from portachat.train.optim import OptimConfig, build_optimizers
from portachat.train.parallel import choose_parallel, grad_sync_paused, load_weights, shard_model
from portachat.train.samples import greedy_samples
from portachat.train.schedule import lr_multiplier, muon_momentum
from portachat.train.signals import StopRequest


class BatchStream(Protocol):
    def next_batch(self) -> Batch | tuple[torch.Tensor, torch.Tensor]: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...


# (model, batch on the device) -> summed loss over the batch's supervised tokens
LossHook = Callable[[torch.nn.Module, Batch], torch.Tensor]
# (model, step) -> metrics; runs on every rank (collectives allowed), logged by rank 0
Evaluator = Callable[[GPT, int], dict[str, float]]


def token_loss(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """Sum of next-token cross-entropies over supervised targets, each times its weight if given
    (RL: the advantage, so the sum is -sum(adv * logprob)); packed rows keep their conversations apart.
    The model computes logits at supervised positions only, in chunks (portachat.model.loss)."""
    extra = {k: v for k, v in (("weights", batch.weights), ("positions", batch.positions),
                               ("supervised", batch.supervised)) if v is not None}
    return model(batch.inputs, batch.targets, loss_reduction="sum", **extra)


def supervised_count(batch: Batch) -> torch.Tensor:
    """What a step's summed loss is divided by, counted over its micro-batches and ranks: supervised tokens."""
    return (batch.targets >= 0).sum()


@dataclass
class Stage:
    """What a stage gives the Trainer."""

    make_stream: Callable[[int, int], BatchStream]  # (stream index, number of streams) -> stream
    # (rank, world) -> validation batches for bits-per-byte over supervised targets; None = no val/bpb
    val_batches: Callable[[int, int], Iterator[tuple[torch.Tensor, torch.Tensor]]] | None = None
    sample_prompts: list[str] = field(default_factory=list)
    loss: LossHook = token_loss
    evaluators: list[Evaluator] = field(default_factory=list)
    # called on every rank after each step's forward/backward; its metrics join the step's log record
    step_metrics: Callable[[], dict[str, float]] | None = None
    # batches made ahead on a background thread (streams of (inputs, targets) that do not read the model)
    prefetch: int = 0
    # (batch on the device) -> the units the loss hook sums over (preference stages: pairs, not tokens)
    count: Callable[[Batch], torch.Tensor] = supervised_count


StageData = Stage  # the name stages used before the Trainer split


@dataclass
class TrainConfig:
    run: str = "default"
    stage: str = "base"
    runs_root: str | None = None  # default <PORTACHAT_HOME>/runs
    device_batch_size: int | str = 4  # "auto": resolve_device_batch_size() finds it once the model exists
    tokens_per_batch: int | None = None  # chat stages: rows per micro-batch drawn by this many padded positions
    total_batch_size: int | None = None  # tokens per optimizer step; None = one micro-batch per rank
    max_seq_len: int = 256
    num_iterations: int = 100
    warmup_ratio: float = 0.0
    warmdown_ratio: float = 0.2
    final_lr_frac: float = 0.0
    muon_momentum_warmup: int = 300  # steps; 0 = full momentum from the start (a stage that starts from trained weights)
    grad_clip: float = 1.0  # 0 disables clipping
    eval_every: int = 100
    eval_tokens: int = 65536
    sample_every: int = 0  # 0 = with every evaluation
    sample_tokens: int = 48
    save_every: int = 0  # 0 = only at the end
    keep_last: int = 2
    log_every: int = 10
    seed: int = 42
    max_bad_steps: int = 5
    fsdp: str = "auto"  # shard with FSDP2: "on", "off", or "auto" = when a replica would not fit in memory
    activation_checkpointing: bool = False  # recompute each block's activations in backward (less memory)
    telemetry_every_s: float = 5.0  # background device sampling (memory, utilisation, temperature, power)
    optim: OptimConfig = field(default_factory=OptimConfig)

    def micro_batch_tokens(self) -> int:
        """Positions one micro-batch holds at most: the token budget, or device batch x sequence."""
        return self.tokens_per_batch or self.device_batch_size * self.max_seq_len

    def grad_accum_steps(self, world_size: int) -> int:
        if self.tokens_per_batch is None:
            return grad_accum_steps(self.total_batch_size, self.device_batch_size, self.max_seq_len, world_size)
        if self.tokens_per_batch < self.max_seq_len:
            raise TrainingError(
                _("--tokens-per-batch {budget} is below --max-seq-len {seq}: a micro-batch must hold at least one "
                  "whole row. Raise --tokens-per-batch or lower --max-seq-len.").format(
                    budget=self.tokens_per_batch, seq=self.max_seq_len))
        per_step = self.tokens_per_batch * world_size
        total = self.total_batch_size or per_step
        if total % per_step:
            raise TrainingError(
                _("--total-batch-size {total} is not a multiple of --tokens-per-batch x devices = {budget} x "
                  "{world} = {per_step}. Use a multiple of {per_step}, e.g. {example}.").format(
                    total=total, budget=self.tokens_per_batch, world=world_size, per_step=per_step,
                    example=per_step * max(1, round(total / per_step))))
        return total // per_step


@dataclass
class TrainResult:
    final_checkpoint: Path | None
    steps: int
    val_bpb: float | None
    samples: list[str]
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class StepStats:
    loss: float  # global summed loss / global supervised tokens
    tokens: int  # global supervised tokens
    stop: bool  # some rank asked to stop
    grad_norm: float | None = None  # total gradient norm before clipping (None: clipping off)
    real_tokens: int = 0  # global input positions holding data (padding left out)
    positions: int = 0  # global input positions computed (padding included)
    attention_pairs: float = 0.0  # global sum over sequences of length squared (attention's work)


def _barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


def load_init_weights(model: GPT, tokenizer: Tokenizer, path: Path) -> dict[str, Any]:
    """Start from another checkpoint's weights (e.g. the previous stage's), without its optimizer state
    or data position. Returns that checkpoint's meta."""
    meta = read_meta(path)
    check_tokenizer_matches(tokenizer, model.config, meta, where=str(path))
    saved_cfg = read_config(path)
    if replace(saved_cfg, max_seq_len=model.config.max_seq_len) != model.config:  # only the context may differ
        raise TrainingError(_("--init {path}: it holds a different model ({saved}) than this stage builds "
                              "({wanted}); pass a checkpoint of this run's model").format(
                                  path=path, saved=saved_cfg, wanted=model.config))
    load_weights_into(model, path)
    return meta


class Trainer:
    """setup() once, then fit(); step(), evaluate() and save() are the pieces fit() is made of."""

    def __init__(
        self,
        model: GPT,
        tokenizer: Tokenizer,
        stage: Stage,
        cfg: TrainConfig,
        dev: Device,
        env: DistEnv,
        stage_path: Path,
        extra_meta: dict[str, Any] | None = None,
        print_fn: Callable[[str], None] = print,
    ) -> None:
        self.model, self.tokenizer, self.stage, self.cfg = model, tokenizer, stage, cfg
        self.dev, self.env, self.stage_path = dev, env, Path(stage_path)
        self.say = print_fn if env.is_main else (lambda _msg: None)
        self.world = env.world_size
        self.accum = cfg.grad_accum_steps(self.world)
        self.num_streams = self.world * self.accum
        self.streams = [stage.make_stream(env.rank * self.accum + m, self.num_streams) for m in range(self.accum)]
        if stage.prefetch > 0:
            self.streams = [PrefetchStream(s, depth=stage.prefetch, device=dev) for s in self.streams]
        self.meta_base = dict(extra_meta or {})
        self.step_count = 0
        self.start_step = 0
        self.total_time = 0.0
        self.metrics: dict[str, float] = {}
        self.samples: list[str] = []
        self.last_loss: float | None = None
        self.logger: RunLogger | None = None
        self.bad_steps = 0  # non-finite steps in a row

    # ---- setup ---------------------------------------------------------------------------

    def setup(self, resume_from: Path | None = None, init_from: Path | None = None) -> None:
        cfg, dev, model = self.cfg, self.dev, self.model
        if resume_from is not None and init_from is not None:
            raise TrainingError(_("--resume continues this stage and --init starts it from other weights: pass one"))
        model.to(dev.torch_device)
        if init_from is not None:
            load_init_weights(model, self.tokenizer, init_from)
            self.say(f"[portachat] {cfg.stage}: " + _("starting from the weights of {path} (fresh optimizer state)").format(
                path=init_from))
        if cfg.activation_checkpointing:
            from portachat.train.activation_checkpointing import apply_activation_checkpointing

            wrapped = apply_activation_checkpointing(model)
            self.say("[portachat] " + _("activation checkpointing: {n} blocks recompute their activations in backward").format(
                n=wrapped))
        # FSDP2 shards in place before the optimizers are built: they must hold the sharded parameters.
        self.parallel = choose_parallel(cfg.fsdp, model, cfg.device_batch_size, cfg.max_seq_len, dev, self.world,
                                        self.say)
        if self.parallel == "fsdp2":
            shard_model(model, dev, self.world)
        self.optimizers = build_optimizers(
            model,
            cfg.optim,
            model_dim=model.config.n_embd,
            ns_dtype=torch.bfloat16 if dev.dtype == torch.bfloat16 else torch.float32,
            fused=dev.fused_optimizer,
        )
        self.scaler = dev.grad_scaler()
        rng_state = None
        if resume_from is not None:
            rng_state = self._resume(resume_from)
            if self.start_step > cfg.num_iterations:
                raise TrainingError(
                    _("{path} is at step {step}, past this run's horizon of {horizon} steps. "
                      "Pass --num-iterations larger than {step} to train on.").format(
                        path=resume_from, step=self.start_step, horizon=cfg.num_iterations)
                )
        self.step_count = self.start_step

        # DDP first, then compile: the compiled graph is split at DDP's gradient buckets (DDPOptimizer), so
        # all-reduces overlap the backward pass. broadcast_buffers=False: the only buffers are rotary tables,
        # derived from the config on every rank; re-broadcasting them each forward is wasted traffic.
        self.ddp = None
        self.train_model: torch.nn.Module = model
        if self.parallel == "ddp":
            self.ddp = DistributedDataParallel(
                model, device_ids=dev.ddp_device_ids, **_no_buffer_sync()
            )
            self.train_model = self.ddp
        if dev.compile:
            self.say("[portachat] " + _("compiling the model ({reason})").format(reason=dev.compile_reason))
            self.train_model = torch.compile(self.train_model)
        self.attention = choose_attention(dev, model, cfg.device_batch_size, cfg.max_seq_len)
        if self.attention.value is not None:
            self.say("[portachat] " + _("attention kernel: {reason}").format(reason=self.attention.reason))
        # The peak of the dtype autocast runs the matmuls in (bf16 on a CPU with AMX is 16x its fp32 rate).
        self.peak = dev.peak_flops(dev.dtype)
        if rng_state is not None:
            dev.set_rng_state(rng_state)
        self.flops_per_token = causal_flops_per_token(model, cfg.max_seq_len)  # attention as the kernel works
        # Honest MFU: the FLOPs of real tokens only (padding is no work done), the output head at supervised
        # positions, weight gradients only for weights that train, attention by each sequence's own length
        # (causal: as the kernel works).
        c = model.config
        self.flop_rates = (*model.training_flop_rates(), attention_flops_per_token(c.n_layer, c.n_head, c.head_dim, 1))
        self.tokens_per_step = cfg.micro_batch_tokens() * self.num_streams
        self.meta_base.update(
            stage=cfg.stage, run=cfg.run, train_config=_config_dict(cfg), device=dev.describe(), world_size=self.world,
            parallel=self.parallel, mfu_attention=MFU_ATTENTION,
            attention_kernel={"value": self.attention.value, "reason": self.attention.reason},
            peak_flops={"value": self.peak.value if math.isfinite(self.peak.value) else None,
                        "source": self.peak.source, "dtype": dev.dtype_name},
        )
        self.say(
            f"[portachat] {cfg.stage}: "
            + (_("{params} params | {steps} steps x {tokens} tokens (batch {batch} x seq {seq_len} x {world} "
                 "device(s) x {accum} accum) | {device} {dtype} | peak {tflops} TFLOPS ({source})") if not cfg.tokens_per_batch
               else _("{params} params | {steps} steps x up to {tokens} tokens ({budget} tokens per micro-batch, rows of "
                      "up to {seq_len} x {world} device(s) x {accum} accum) | {device} {dtype} | peak {tflops} TFLOPS "
                      "({source})")).format(
                params=f"{model.num_params():,}", steps=cfg.num_iterations, tokens=f"{self.tokens_per_step:,}",
                batch=cfg.device_batch_size, budget=f"{cfg.tokens_per_batch or 0:,}", seq_len=cfg.max_seq_len,
                world=self.world, accum=self.accum, device=dev.kind, dtype=str(dev.dtype).removeprefix("torch."),
                tflops=f"{self.peak.value / 1e12:.2f}", source=self.peak.source)
            + " | " + _("MFU counts causal attention (half of full: what the kernel computes)")
        )
        if self.start_step:
            self.say("[portachat] " + _("resumed from {path} at step {step}").format(path=resume_from, step=self.start_step))

    def _resume(self, path: Path) -> dict[str, torch.Tensor] | None:
        """Load weights, optimizer state and data positions; returns this rank's saved RNG state
        (applied just before training, after anything that draws random numbers)."""
        model, env = self.model, self.env
        meta = read_meta(path)
        check_tokenizer_matches(self.tokenizer, model.config, meta, where=str(path))
        saved_cfg = read_config(path)
        if saved_cfg != model.config:
            raise TrainingError(
                _("cannot resume from {path}: it holds a different model ({saved}) than this run asks for "
                  "({wanted}). Drop --resume or use the same --depth / --max-seq-len as the run you continue.").format(
                    path=path, saved=saved_cfg, wanted=model.config)
            )
        load_weights(model, path)  # straight into the training model (its shard under FSDP2): no second copy
        # The implementation flags are this device's choice, not the saving machine's (fused AdamW on a
        # CUDA run resumed on a CPU would fail).
        impl = [[{k: g[k] for k in ("fused", "foreach") if k in g} for g in opt.param_groups] for opt in self.optimizers]
        saved_scaler = load_optimizers(path, model, self.optimizers)
        for opt, groups in zip(self.optimizers, impl, strict=True):
            for group, flags in zip(opt.param_groups, groups, strict=True):
                group.update(flags)
        if self.scaler is not None and saved_scaler:
            self.scaler.load_state_dict(saved_scaler)
        rng = load_rng(path, env.rank)
        positions = meta.get("data_position", {})
        if positions.get("num_streams") == self.num_streams:
            for m, stream in enumerate(self.streams):
                stream.load_state_dict(positions["streams"][str(env.rank * self.accum + m)])
        else:
            self.say(
                "[portachat] " + _("warning: the checkpoint read data as {saved} streams, this run uses {streams} "
                                   "(devices x accumulation changed); data restarts at each stream's beginning.").format(
                    saved=positions.get("num_streams"), streams=self.num_streams)
            )
        self.start_step = int(meta["step"])
        self.total_time = float((meta.get("metrics") or {}).get("total_training_time_s") or 0.0)
        self.metrics = {k: v for k, v in (meta.get("metrics") or {}).items() if k != "total_training_time_s"}
        return rng

    # ---- one optimizer step ----------------------------------------------------------------

    def next_micro_batches(self) -> list[Batch]:
        return [as_batch(stream.next_batch()) for stream in self.streams]

    def forward_backward(self, micro_batches: list[Batch], stop_requested: bool = False) -> StepStats:
        """Accumulate the gradient of sum(loss) / (global supervised tokens) over `micro_batches`.

        The count is taken before the first backward: one small all-reduce, kept on the device (no
        host sync); with DDP averaging gradients over ranks, each rank scales by world / global count."""
        dev = self.dev
        # What the loader knows of its rows (host numbers, no sync): real tokens, positions, attention work.
        shape = [float(sum(b.num_real() for b in micro_batches)), float(sum(b.inputs.numel() for b in micro_batches)),
                 float(sum(b.attention_pairs() for b in micro_batches))]
        batches = [b.to(dev.torch_device) for b in micro_batches]
        count = torch.stack([self.stage.count(b) for b in batches]).sum().float()
        if self.world > 1:
            dist.all_reduce(count)
        scale = self.world / count.clamp(min=1.0)
        loss_sum = torch.zeros((), device=dev.torch_device)
        for micro, batch in enumerate(batches):
            last = micro == len(batches) - 1
            ctx = grad_sync_paused(self.ddp or self.model) if not last else contextlib.nullcontext()
            with ctx:
                with dev.autocast():
                    loss = self.stage.loss(self.train_model, batch)
                loss_sum += loss.detach().float()
                scaled = loss * scale
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
        # One collective carries the loss and the stop request; one host sync reads them with the count.
        extra = torch.tensor([float(stop_requested), *shape], device=dev.torch_device)
        packed = torch.cat([loss_sum.reshape(1), extra])
        if self.world > 1:
            dist.all_reduce(packed)
        self.grad_norm = device_grad_norm(self.model.parameters(), self.optimizers, self.scaler, self.cfg.grad_clip,
                                          dev.torch_device)  # fmt: skip
        total_loss, stop, real, positions, pairs, tokens, norm = torch.cat(
            [packed, count.reshape(1), readable(self.grad_norm)]).tolist()
        return StepStats(loss=total_loss / max(tokens, 1.0), tokens=int(tokens), stop=stop > 0,
                         grad_norm=norm if self.cfg.grad_clip > 0 else None, real_tokens=int(real),
                         positions=int(positions), attention_pairs=pairs)

    def step(self, stop_requested: bool = False) -> tuple[dict[str, Any], bool]:
        """One optimizer step; returns (the step's log record, whether any rank asked to stop)."""
        cfg, dev, step = self.cfg, self.dev, self.step_count
        t0 = time.perf_counter()  # no sync: forward_backward's one transfer per step paces the host
        micro_batches = self.next_micro_batches()
        loader_wait = time.perf_counter() - t0  # the step waited this long for the data pipeline
        stats = self.forward_backward(micro_batches, stop_requested)
        lrm = lr_multiplier(step, cfg.num_iterations, cfg.warmup_ratio, cfg.warmdown_ratio, cfg.final_lr_frac)
        for opt in self.optimizers:
            for group in opt.param_groups:
                group["lr"] = group["initial_lr"] * lrm
                if "momentum" in group:
                    group["momentum"] = muon_momentum(step, warmup_steps=cfg.muon_momentum_warmup)
        applied, grad_norm = _clip_and_step(self.model, self.optimizers, self.scaler, cfg.grad_clip, stats,
                                            self.grad_norm)  # fmt: skip
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        self._guard(applied, stats.loss)
        dt = time.perf_counter() - t0
        self.total_time += dt
        self.step_count += 1
        self.last_loss = stats.loss
        # Real tokens only: padding is neither throughput nor useful FLOPs.
        tok_per_s = stats.real_tokens / dt
        peak = self.peak.value
        per_real, per_supervised, per_pair = self.flop_rates
        flops = per_real * stats.real_tokens + per_supervised * stats.tokens + per_pair * stats.attention_pairs
        mfu = flops / dt / (peak * self.world) if peak > 0 else None
        record = {
            "loss": stats.loss,
            "lr_mult": lrm,
            "tok_per_s": tok_per_s,
            "mfu": mfu,
            "dt_s": dt,
            "grad_norm": grad_norm,
            "supervised_tokens": stats.tokens,
            "real_tokens": stats.real_tokens,
            "padding": 1.0 - stats.real_tokens / max(stats.positions, 1),  # share of computed positions
            "loader_wait_s": loader_wait,
        }
        if self._log_due(self.step_count):  # memory stats are driver calls: only on logged steps
            mem = dev.memory()
            record["mem_bytes"] = mem.peak_allocated or mem.allocated
        if self.stage.step_metrics is not None:
            record.update(self.stage.step_metrics())
        return record, stats.stop

    def _guard(self, applied: bool, step_loss: float) -> None:
        # An fp16 gradient overflow is routine (the scaler backs off) until even a scale below 1
        # overflows; a non-finite loss or an unscaled non-finite gradient is a real problem.
        step, scaler = self.step_count, self.scaler
        overflow_only = scaler is not None and math.isfinite(step_loss) and scaler.get_scale() >= 1.0
        if applied:
            self.bad_steps = 0
        elif overflow_only:
            self.say("[portachat] " + _("step {step}:").format(step=step) + " " + _("fp16 gradient overflow, update skipped; loss scale now {scale}").format(
                scale=f"{scaler.get_scale():g}"))
        else:
            self.bad_steps += 1
            self.say("[portachat] " + _("step {step}:").format(step=step) + " "
                     + _("non-finite loss/gradient ({loss}); update skipped ({n} in a row)").format(
                         loss=step_loss, n=self.bad_steps))
            if self.bad_steps >= self.cfg.max_bad_steps:
                raise TrainingError(
                    _("training diverged: {n} steps in a row had a non-finite loss or gradient. "
                      "Lower the learning rates (e.g. --matrix-lr, --embedding-lr by 2-4x), keep gradient clipping on "
                      "(--grad-clip 1.0), prefer bf16 or fp32 over fp16 (--dtype), and check the data for "
                      "garbage. The last good checkpoint is under {path}; resume with --resume.").format(
                        n=self.bad_steps, path=self.stage_path)
                )

    # ---- evaluation and checkpoints ------------------------------------------------------------

    def evaluate(self, step: int) -> dict[str, float]:
        """Validation bits/byte, the stage's evaluators, and (rank 0) samples; logged at `step`."""
        dev, env, cfg = self.dev, self.env, self.cfg
        collect_garbage()
        results: dict[str, float] = {}
        # FSDP2: evaluate a whole copy of the weights on every rank, so evaluators and the engine work as with
        # replicas (ranks score different examples; no collective inside a forward for them to disagree on).
        model = whole_copy(self.model) if self.parallel == "fsdp2" else self.model
        if self.stage.val_batches is not None:
            bpb = evaluate_bpb(model, self.stage.val_batches(env.rank, self.world), self.tokenizer.token_bytes(),
                               dev.torch_device, dev.autocast)
            results["val_bpb"] = bpb
            self.say("[portachat] " + _("step {step}:").format(step=step) + " " + _("validation bits/byte {bpb}").format(bpb=f"{bpb:.4f}"))
        was_training = model.training
        model.eval()
        try:
            for evaluator in self.stage.evaluators:
                found = evaluator(model, step)
                results.update(found)
                if found:
                    self.say("[portachat] " + _("step {step}:").format(step=step) + " "
                             + ", ".join(f"{k} {v:.4f}" for k, v in found.items()))
        finally:
            model.train(was_training)
        self.metrics.update(results)
        if self.logger is not None:
            self.logger.log(step, {("val/bpb" if k == "val_bpb" else f"eval/{k}"): v for k, v in results.items()})
        if env.is_main and self.stage.sample_prompts and (cfg.sample_every == 0 or step % cfg.sample_every == 0):
            self.samples = greedy_samples(model, self.tokenizer, self.stage.sample_prompts, cfg.sample_tokens, dev)
            label = _("sample")
            indent = " " * (display_width(label) + 3)  # continuation lines align under the first line's "|"
            for text in self.samples:
                self.say("  " + label + " | " + text.replace("\n", "\n" + indent + "| "))
            if self.logger is not None:
                self.logger.log_text(step, "samples", "\n\n".join(self.samples))
        return results

    def save(self, step: int, final: bool) -> Path:
        """A checkpoint of `step`, carrying the metrics measured at that step (evaluate first)."""
        collect_garbage()
        meta = dict(self.meta_base)
        metrics = {**self.metrics, "train_loss": self.last_loss, "total_training_time_s": self.total_time}
        metrics.setdefault("val_bpb", None)
        meta.update(step=step, final=final, metrics=metrics)
        path = save_checkpoint(
            self.stage_path,
            step,
            self.model,
            self.tokenizer,
            meta,
            optimizers=self.optimizers,
            scaler=self.scaler,
            streams=self.streams,
            stream_offset=self.env.rank * self.accum,
            num_streams=self.num_streams,
            rng=self.dev.get_rng_state(),
            env=self.env,
            device=self.dev.torch_device,
            keep_last=self.cfg.keep_last,
        )
        self.say("[portachat] " + _("saved checkpoint {path}").format(path=path))
        return path

    # ---- the loop ----------------------------------------------------------------------------

    def _log_due(self, step: int) -> bool:
        return step % self.cfg.log_every == 0 or step == self.start_step + 1 or step == self.cfg.num_iterations

    def _eval_due(self, step: int) -> bool:
        every = self.cfg.eval_every
        return step == self.cfg.num_iterations or (every > 0 and step % every == 0)

    def fit(self) -> TrainResult:
        cfg, env = self.cfg, self.env
        dt_ema: float | None = None
        warned_mfu = False
        monitor: TelemetryMonitor | None = None
        # Signals first: a Ctrl-C during slow setup (the logger imports tensorboard) still saves.
        with StopRequest() as stop:
            try:
                self.logger = RunLogger(self.stage_path, enabled=env.is_main)
                self.logger.log(self.step_count, {"mfu_attention": MFU_ATTENTION})  # how "mfu" below counts
                if env.is_main and cfg.telemetry_every_s > 0:  # vendor tools are slow: never inside the step
                    monitor = TelemetryMonitor(self.dev, cfg.telemetry_every_s).start()
                self.train_model.train()
                if self.start_step == 0 and cfg.eval_every > 0 and cfg.num_iterations > 0:
                    self.evaluate(0)  # where the stage starts from
                freeze_gc()  # no collector scans inside the loop; evaluate() and save() collect
                while self.step_count < cfg.num_iterations:
                    record, stop_now = self.step(stop.requested)
                    step = self.step_count
                    if step > self.start_step + 1:  # the first step pays compilation and warm-up
                        dt_ema = record["dt_s"] if dt_ema is None else 0.9 * dt_ema + 0.1 * record["dt_s"]
                    mfu = record["mfu"]
                    if mfu is not None and mfu > 1.0 and not warned_mfu:
                        warned_mfu = True
                        self.say(
                            "[portachat] " + _("MFU above 100% means the {source} peak ({tflops} TFLOPS) is too "
                                               "low, e.g. measured while the machine was busy: run `portachat doctor "
                                               "--calibrate` on an idle machine.").format(
                                source=self.peak.source, tflops=f"{self.peak.value / 1e12:.2f}")
                        )
                    show = env.is_main and self._log_due(step)
                    if show and monitor is not None:  # the background monitor's latest sample
                        sample = monitor.latest()
                        record.update({k: sample[k] for k in ("util_pct", "temp_c", "power_w") if k in sample})
                        record.update({f"device/{k}": v for k, v in sample.items() if k.startswith("mem_")})
                    self.logger.log(step, record)
                    if show:
                        eta = (dt_ema or record["dt_s"]) * (cfg.num_iterations - step)
                        self.say(format_progress(step, cfg.num_iterations, record, eta))
                    if step == cfg.num_iterations:
                        break
                    collect_garbage(step)  # every GC_COLLECT_EVERY steps
                    if self._eval_due(step):
                        self.evaluate(step)
                    if (cfg.save_every > 0 and step % cfg.save_every == 0) or stop_now:
                        self.save(step, final=False)
                    if stop_now:
                        raise KeyboardInterrupt(f"stopped at step {step}; resume with --resume")
                step = self.step_count
                self.evaluate(step)
                if self.ddp is not None:
                    _check_replicas_in_sync(self.model, self.world, self.say)
                final = self.save(step, final=True)
            finally:
                thaw_gc()
                if monitor is not None:
                    monitor.stop()
                for stream in self.streams:
                    if isinstance(stream, PrefetchStream):
                        stream.close()
                if self.logger is not None:
                    self.logger.close()
        _barrier(self.world)
        return TrainResult(final_checkpoint=final, steps=step, val_bpb=self.metrics.get("val_bpb"),
                           samples=self.samples, metrics=dict(self.metrics))


def train(
    model: GPT,
    tokenizer: Tokenizer,
    data: Stage,
    cfg: TrainConfig,
    dev: Device,
    env: DistEnv,
    stage_path: Path,
    resume_from: Path | None = None,
    init_from: Path | None = None,
    extra_meta: dict[str, Any] | None = None,
    print_fn: Callable[[str], None] = print,
) -> TrainResult:
    """Run (or resume) a training stage and return where its final checkpoint is."""
    trainer = Trainer(model, tokenizer, data, cfg, dev, env, stage_path, extra_meta=extra_meta, print_fn=print_fn)
    trainer.setup(resume_from=resume_from, init_from=init_from)
    return trainer.fit()


def _no_buffer_sync() -> dict[str, bool]:
    """DDP's switch for not re-broadcasting buffers every forward: `forward_sync_buffers` from torch 2.13
    (which deprecates `broadcast_buffers`), `broadcast_buffers` before."""
    params = inspect.signature(DistributedDataParallel.__init__).parameters
    return {"forward_sync_buffers": False} if "forward_sync_buffers" in params else {"broadcast_buffers": False}


def _check_replicas_in_sync(model: GPT, world: int, say: Callable[[str], None]) -> None:
    """Data parallelism must keep every rank's weights bit-identical; verify it instead of assuming it."""
    with torch.no_grad():  # integer sums of the weights' bit patterns: exact, in any order, and no float64
        local = torch.stack([_bits(p.detach()).sum(dtype=torch.int64) for p in model.parameters()])
    gathered = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(gathered, local)
    if not all(torch.equal(gathered[0], g) for g in gathered[1:]):
        raise TrainingError(_("the ranks' weights diverged: data-parallel replicas are out of sync (please report "
                              "this)"))
    say("[portachat] " + _("weights identical on all {world} ranks (checksum {checksum})").format(
        world=world, checksum=gathered[0].sum().item()))


_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's raw bits as integers of the same width (bit-identical tensors give identical sums)."""
    return t.contiguous().view(_INT_OF_SIZE[t.element_size()])


def _clip_and_step(model, optimizers, scaler, grad_clip: float, stats: StepStats,
                   norm: torch.Tensor) -> tuple[bool, float | None]:  # fmt: skip
    """Clip (by `norm`, the device-side norm `stats.grad_norm` was read from; fp16 gradients already
    unscaled) and step every optimizer; returns (update applied, gradient norm).

    Without a scaler a non-finite loss or gradient skips the update here. With fp16's GradScaler the
    scaler itself skips an update whose gradients hold inf/NaN and lowers the loss scale, so the
    step always goes through it (calling update() without a step would be an error).
    """
    if scaler is None and not math.isfinite(stats.loss):
        return False, None
    grad_norm = stats.grad_norm
    if scaler is None and grad_norm is not None and not math.isfinite(grad_norm):
        return False, grad_norm
    clip_with_norm(model.parameters(), grad_clip, norm)
    if scaler is None:
        for opt in optimizers:
            opt.step()
        return True, grad_norm
    scale_before = scaler.get_scale()
    for opt in optimizers:
        scaler.step(opt)
    scaler.update()
    return scaler.get_scale() >= scale_before, grad_norm  # a skipped step always lowers the scale


def _config_dict(cfg: TrainConfig) -> dict[str, Any]:
    d = asdict(cfg)
    d["optim"]["adam_betas"] = list(cfg.optim.adam_betas)
    return d


def resolve_device_batch_size(cfg: TrainConfig, model: GPT, dev: Device, env: DistEnv, say: Callable[[str], None],
                              row_len: Callable[[], int] | None = None) -> None:
    """Turn `--device-batch-size auto` into the largest batch that fits (real steps on this device), the
    same on every rank, and dividing --total-batch-size so accumulation is exact. `row_len`: the padded
    length the data's rows really reach (chat data), probed instead of --max-seq-len."""
    if cfg.device_batch_size != "auto":
        return
    if cfg.tokens_per_batch is not None:  # rows are drawn by the budget: the batch size is not used
        cfg.device_batch_size = 1
        say("[portachat] " + _("--device-batch-size auto: not used, --tokens-per-batch {n} sets each micro-batch").format(
            n=cfg.tokens_per_batch))
        return
    from portachat.train.batch_size import auto_device_batch_size

    batch, _accum = auto_device_batch_size(model.config, cfg.max_seq_len, dev, cfg.total_batch_size, env.world_size,
                                      activation_checkpointing=cfg.activation_checkpointing, say=say,
                                      row_len=row_len() if row_len is not None else None)
    if env.world_size > 1:  # every rank must run the same shapes: the smallest device decides
        t = torch.tensor([batch], device=dev.torch_device if dist.get_backend() != "gloo" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        batch = int(t.item())
    cfg.device_batch_size = batch
    say("[portachat] " + _("--device-batch-size auto: {batch} rows per device, {accum} accumulation step(s)").format(
        batch=batch, accum=cfg.grad_accum_steps(env.world_size)))
