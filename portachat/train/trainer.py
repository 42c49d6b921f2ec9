"""The Trainer every stage shares (base, mid, sft, rl).

A stage supplies the model, the tokenizer and a `Stage`: its data streams, a loss hook, evaluators.
The Trainer owns everything else: device placement, data parallelism, gradient accumulation, mixed
precision, schedules, the NaN guard, evaluation, logging, checkpoints and exact resume.

Loss normalisation: a loss hook returns the SUMMED loss of a micro-batch; the Trainer divides by the
number of supervised tokens of the whole optimizer step, counted over every micro-batch and every
rank before the first backward. So a masked batch weighs each supervised token equally however the
batch is split across accumulation steps and devices.

The Trainer's parts live by job: the config and result (config.py), what a stage hands in (hooks.py),
resume (resume.py), one step's schedules, clip and optimizer step (step.py), evaluation and samples
(evaluation.py), the progress lines (logger.py), the replica check (replicas.py), `auto` batch sizes
(batch_size.py). Stages keep importing the names they use from here.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from portachat.checkpoint import save_checkpoint
from portachat.checkpoint.sharded import whole_copy
from portachat.data.batch import Batch, as_batch
from portachat.data.prefetch import PrefetchStream
from portachat.device import Device, DistEnv
from portachat.device.flops import attention_flops_per_token
from portachat.device.telemetry import TelemetryMonitor
from portachat.i18n import _
from portachat.model import GPT
from portachat.tokenizer import Tokenizer
from portachat.train.accumulation import TrainingError
from portachat.train.activation_checkpointing import apply_activation_checkpointing
from portachat.train.batch_size import resolve_device_batch_size
from portachat.train.compile_fallback import compile_or_eager
from portachat.train.config import TrainConfig, TrainResult, config_dict
from portachat.train.evaluation import run_evaluators, show_samples
from portachat.train.hooks import (
    BatchStream,
    Evaluator,
    LossHook,
    Stage,
    supervised_count,
    token_loss,
)
from portachat.train.hot_path import (
    MFU_ATTENTION,
    causal_flops_per_token,
    choose_attention,
    collect_garbage,
    device_grad_norm,
    freeze_gc,
    readable,
    thaw_gc,
)
from portachat.train.logger import RunLogger, format_progress, format_run_banner
from portachat.train.optim import training_optimizers
from portachat.train.parallel import choose_parallel, grad_sync_paused, no_buffer_sync, shard_model
from portachat.train.replicas import check_replicas_in_sync
from portachat.train.resume import load_init_weights, restore_training_state
from portachat.train.signals import StopRequest
from portachat.train.step import StepStats, apply_schedules, clip_and_step

# What stages import from here: the Trainer's own names, kept importable from this module after the split.
__all__ = ["BatchStream", "Evaluator", "LossHook", "Stage", "StepStats", "TrainConfig", "TrainResult",
           "Trainer", "TrainingError", "load_init_weights", "resolve_device_batch_size", "supervised_count",
           "token_loss", "train"]


def _barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


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
            wrapped = apply_activation_checkpointing(model)
            self.say("[portachat] " + _("activation checkpointing: {n} blocks recompute their activations in backward").format(
                n=wrapped))
        # FSDP2 shards in place before the optimizers are built: they must hold the sharded parameters.
        self.parallel = choose_parallel(cfg.fsdp, model, cfg.device_batch_size, cfg.max_seq_len, dev, self.world,
                                        self.say)
        if self.parallel == "fsdp2":
            shard_model(model, dev, self.world)
        # The stage's optimizers, or Muon + AdamW with the device's Newton-Schulz dtype (the one rule the
        # batch-size finder and the profiler use too, so they measure the optimizer that trains).
        self.optimizers = (self.stage.optimizers(model) if self.stage.optimizers is not None
                           else training_optimizers(model, cfg.optim, dev))
        self.scaler = dev.grad_scaler()
        rng_state = self._resume(resume_from) if resume_from is not None else None
        self.step_count = self.start_step

        # DDP first, then compile: the compiled graph is split at DDP's gradient buckets (DDPOptimizer), so
        # all-reduces overlap the backward pass. broadcast_buffers=False: the only buffers are rotary tables,
        # derived from the config on every rank; re-broadcasting them each forward is wasted traffic.
        self.ddp = None
        self.train_model: torch.nn.Module = model
        if self.parallel == "ddp":
            self.ddp = DistributedDataParallel(model, device_ids=dev.ddp_device_ids, **no_buffer_sync())
            self.train_model = self.ddp
        if dev.compile:
            self.say("[portachat] " + _("compiling the model ({reason})").format(reason=dev.compile_reason))
            self.train_model = compile_or_eager(self.train_model, dev.compile_backend, self.say)
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
            stage=cfg.stage, run=cfg.run, train_config=config_dict(cfg), device=dev.describe(), world_size=self.world,
            parallel=self.parallel, mfu_attention=MFU_ATTENTION,
            attention_kernel={"value": self.attention.value, "reason": self.attention.reason},
            peak_flops={"value": self.peak.value if math.isfinite(self.peak.value) else None,
                        "source": self.peak.source, "dtype": dev.dtype_name},
        )
        self.say(format_run_banner(
            cfg.stage, model.num_params(), cfg.num_iterations, self.tokens_per_step, cfg.device_batch_size,
            cfg.tokens_per_batch, cfg.max_seq_len, self.world, self.accum, dev.kind, str(dev.dtype).removeprefix("torch."),
            self.peak.value, self.peak.source))
        if self.start_step:
            self.say("[portachat] " + _("resumed from {path} at step {step}").format(path=resume_from, step=self.start_step))

    def _resume(self, path: Path) -> dict[str, torch.Tensor] | None:
        """Load weights, optimizer and fp16 scaler state and data positions, refusing a checkpoint past this
        run's horizon; returns this rank's saved RNG state (applied just before training, after anything
        that draws random numbers)."""
        files = self.stage.model_files
        restored = restore_training_state(path, self.model, self.tokenizer, self.optimizers, self.scaler, self.streams,
                                          self.env.rank * self.accum, self.num_streams, self.env.rank, self.say,
                                          load_model=files.load if files is not None else None)
        if restored.step > self.cfg.num_iterations:
            raise TrainingError(
                _("{path} is at step {step}, past this run's horizon of {horizon} steps. "
                  "Pass --num-iterations larger than {step} to train on.").format(
                    path=path, step=restored.step, horizon=self.cfg.num_iterations)
            )
        self.start_step, self.total_time, self.metrics = restored.step, restored.total_time, restored.metrics
        return restored.rng

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
        lrm = apply_schedules(self.optimizers, step, cfg)
        applied, grad_norm = clip_and_step(self.model, self.optimizers, self.scaler, cfg.grad_clip, stats, self.grad_norm)
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
        # FSDP2: evaluate a whole copy of the weights on every rank, so evaluators and the engine work as with
        # replicas (ranks score different examples; no collective inside a forward for them to disagree on).
        model = whole_copy(self.model) if self.parallel == "fsdp2" else self.model
        results = run_evaluators(model, self.stage, self.tokenizer, dev, env.rank, self.world, step, self.say)
        self.metrics.update(results)
        if self.logger is not None:
            self.logger.log(step, {("val/bpb" if k == "val_bpb" else f"eval/{k}"): v for k, v in results.items()})
        if env.is_main and self.stage.sample_prompts and (cfg.sample_every == 0 or step % cfg.sample_every == 0):
            self.samples = show_samples(model, self.tokenizer, self.stage.sample_prompts, cfg.sample_tokens, dev, self.say)
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
        files = self.stage.model_files  # None: the whole model; LoRA: its adapter (gathered on every rank)
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
            write_model=files.gather(self.model, self.tokenizer) if files is not None else None,
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
                        raise KeyboardInterrupt(_("stopped at step {step}; resume with --resume").format(step=step))
                step = self.step_count
                self.evaluate(step)
                if self.ddp is not None:
                    check_replicas_in_sync(self.model, self.world, self.say)
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
