"""The training loop every stage shares (base, mid, sft, rl).

A stage supplies the model, the tokenizer and its data (`StageData`); the loop owns everything
else: device placement, data parallelism, gradient accumulation, mixed precision, schedules,
the NaN guard, validation, samples, logging, checkpoints and exact resume.
"""

from __future__ import annotations

import contextlib
import math
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from portachat.checkpoint import save_checkpoint
from portachat.checkpoint.model_dir import check_tokenizer_matches, load_weights_into, read_config, read_meta
from portachat.checkpoint.trainer_state import load_optimizers, load_rng
from portachat.device import Device, DistEnv
from portachat.eval.bpb import evaluate_bpb
from portachat.model import GPT, generate
from portachat.tokenizer import Tokenizer
from portachat.train.logger import RunLogger, format_progress
from portachat.train.optim import OptimConfig, build_optimizers
from portachat.train.schedule import lr_multiplier, muon_momentum


class TrainingError(RuntimeError):
    """Training cannot go on; the message says what happened and what to do."""


class BatchStream(Protocol):
    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...


@dataclass
class StageData:
    """What a stage gives the loop."""

    make_stream: Callable[[int, int], BatchStream]  # (stream index, number of streams) -> stream
    val_batches: Callable[[int, int], Iterator[tuple[torch.Tensor, torch.Tensor]]]  # (rank, world) -> batches
    sample_prompts: list[str] = field(default_factory=list)


@dataclass
class TrainConfig:
    run: str = "default"
    stage: str = "base"
    runs_root: str | None = None  # default <PORTACHAT_HOME>/runs
    device_batch_size: int = 4
    total_batch_size: int | None = None  # tokens per optimizer step; None = one micro-batch per rank
    max_seq_len: int = 256
    num_iterations: int = 100
    warmup_ratio: float = 0.0
    warmdown_ratio: float = 0.2
    final_lr_frac: float = 0.0
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
    optim: OptimConfig = field(default_factory=OptimConfig)

    def grad_accum_steps(self, world_size: int) -> int:
        per_step = self.device_batch_size * self.max_seq_len * world_size
        total = self.total_batch_size or per_step
        if total % per_step:
            raise TrainingError(
                f"--total-batch-size {total} is not a multiple of device batch x sequence x devices "
                f"= {self.device_batch_size} x {self.max_seq_len} x {world_size} = {per_step}. "
                f"Use a multiple of {per_step}, e.g. {per_step * max(1, round(total / per_step))}."
            )
        return total // per_step


@dataclass
class TrainResult:
    final_checkpoint: Path | None
    steps: int
    val_bpb: float | None
    samples: list[str]


class _StopRequest:
    """SIGINT/SIGTERM ask the loop to save and stop at the next step boundary (never mid-write)."""

    def __init__(self) -> None:
        self.requested = False
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _StopRequest:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (e.g. tests): leave signals alone
                pass
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested:  # a second Ctrl-C means now
            raise KeyboardInterrupt
        self.requested = True
        print(f"\n[portachat] signal {signum}: saving a checkpoint at the end of this step, then stopping", flush=True)

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _all_reduce_mean(t: torch.Tensor, world: int) -> torch.Tensor:
    if world > 1:
        dist.all_reduce(t)
        t = t / world
    return t


def _barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


def train(
    model: GPT,
    tokenizer: Tokenizer,
    data: StageData,
    cfg: TrainConfig,
    dev: Device,
    env: DistEnv,
    stage_path: Path,
    resume_from: Path | None = None,
    extra_meta: dict[str, Any] | None = None,
    print_fn: Callable[[str], None] = print,
) -> TrainResult:
    """Run (or resume) a training stage and return where its final checkpoint is."""
    say = print_fn if env.is_main else (lambda _msg: None)
    world = env.world_size
    accum = cfg.grad_accum_steps(world)
    tokens_per_step = cfg.device_batch_size * cfg.max_seq_len * world * accum
    num_streams = world * accum
    streams = [data.make_stream(env.rank * accum + m, num_streams) for m in range(accum)]

    model.to(dev.torch_device)
    optimizers = build_optimizers(
        model,
        cfg.optim,
        model_dim=model.config.n_embd,
        ns_dtype=torch.bfloat16 if dev.dtype == torch.bfloat16 else torch.float32,
        fused=dev.fused_optimizer,
    )
    scaler = dev.grad_scaler()
    start_step, total_time, rng_state = 0, 0.0, None
    if resume_from is not None:
        start_step, total_time, rng_state = _resume(
            resume_from, model, tokenizer, optimizers, scaler, streams, dev, env, accum, say
        )
        if start_step > cfg.num_iterations:
            raise TrainingError(
                f"{resume_from} is at step {start_step}, past this run's horizon of {cfg.num_iterations} steps. "
                f"Pass --num-iterations larger than {start_step} to train on."
            )

    # DDP first, then compile: the compiled graph is split at DDP's gradient buckets (DDPOptimizer), so
    # all-reduces overlap the backward pass instead of waiting for all of it.
    ddp = None
    train_model: torch.nn.Module = model
    if world > 1:
        ddp = DistributedDataParallel(model, device_ids=[dev.index] if dev.type != "cpu" else None)
        train_model = ddp
    if dev.compile:
        say(f"[portachat] compiling the model ({dev.compile_reason})")
        train_model = torch.compile(train_model)
    peak = dev.peak_flops(dev.dtype)  # may measure with random matrices: before the RNG is restored
    if rng_state is not None:
        dev.set_rng_state(rng_state)
    flops_per_token = model.flops_per_token(cfg.max_seq_len)
    logger = RunLogger(stage_path, enabled=env.is_main)
    token_bytes = tokenizer.token_bytes()
    meta_base = dict(extra_meta or {})
    meta_base.update(stage=cfg.stage, run=cfg.run, train_config=_config_dict(cfg), device=dev.describe(), world_size=world)

    say(
        f"[portachat] {cfg.stage}: {model.num_params():,} params | {cfg.num_iterations} steps x {tokens_per_step:,} tokens "
        f"(batch {cfg.device_batch_size} x seq {cfg.max_seq_len} x {world} device(s) x {accum} accum) | "
        f"{dev.kind} {str(dev.dtype).removeprefix('torch.')} | peak {peak.value / 1e12:.2f} TFLOPS ({peak.source})"
    )
    if start_step:
        say(f"[portachat] resumed from {resume_from} at step {start_step}")

    val_bpb: float | None = None
    samples: list[str] = []
    bad_steps = 0
    dt_ema: float | None = None
    warned_mfu = False
    step = start_step

    def evaluate(step: int) -> None:
        nonlocal val_bpb, samples
        val_bpb = evaluate_bpb(model, data.val_batches(env.rank, world), token_bytes, dev.torch_device, dev.autocast)
        say(f"[portachat] step {step}: validation bits/byte {val_bpb:.4f}")
        logger.log(step, {"val/bpb": val_bpb})
        if env.is_main and data.sample_prompts and (cfg.sample_every == 0 or step % cfg.sample_every == 0):
            samples = _samples(model, tokenizer, data.sample_prompts, cfg.sample_tokens, dev, cfg.seed)
            for text in samples:
                say("  sample | " + text.replace("\n", "\n         | "))
            logger.log_text(step, "samples", "\n\n".join(samples))

    def checkpoint(step: int, final_save: bool) -> Path:
        meta = dict(meta_base)
        meta.update(
            step=step,
            final=final_save,
            metrics={"val_bpb": val_bpb, "train_loss": last_loss, "total_training_time_s": total_time},
        )
        path = save_checkpoint(
            stage_path,
            step,
            model,
            tokenizer,
            meta,
            optimizers=optimizers,
            scaler=scaler,
            streams=streams,
            stream_offset=env.rank * accum,
            num_streams=num_streams,
            rng=dev.get_rng_state(),
            env=env,
            device=dev.torch_device,
            keep_last=cfg.keep_last,
        )
        say(f"[portachat] saved checkpoint {path}")
        return path

    last_loss: float | None = None
    with _StopRequest() as stop:
        train_model.train()
        while True:
            last = step >= cfg.num_iterations
            if cfg.eval_every > 0 and (step % cfg.eval_every == 0 or last) or (last and cfg.eval_every <= 0):
                evaluate(step)
            if last:
                break

            dev.synchronize()
            t0 = time.perf_counter()
            loss_sum = torch.zeros((), device=dev.torch_device)
            for micro, stream in enumerate(streams):
                inputs, targets = stream.next_batch()
                inputs = inputs.to(dev.torch_device, non_blocking=True)
                targets = targets.to(dev.torch_device, non_blocking=True)
                sync_now = micro == accum - 1
                ctx = ddp.no_sync() if (ddp is not None and not sync_now) else contextlib.nullcontext()
                with ctx:
                    with dev.autocast():
                        loss = train_model(inputs, targets)
                    loss_sum += loss.detach().float()
                    scaled = loss / accum
                    (scaler.scale(scaled) if scaler else scaled).backward()
            # One collective carries the loss and the stop request.
            packed = torch.stack([loss_sum / accum, torch.tensor(float(stop.requested), device=dev.torch_device)])
            packed = _all_reduce_mean(packed, world)
            step_loss = packed[0].item()
            stop_now = packed[1].item() > 0

            lrm = lr_multiplier(step, cfg.num_iterations, cfg.warmup_ratio, cfg.warmdown_ratio, cfg.final_lr_frac)
            for opt in optimizers:
                for group in opt.param_groups:
                    group["lr"] = group["initial_lr"] * lrm
                    if "momentum" in group:
                        group["momentum"] = muon_momentum(step)
            applied, grad_norm = _clip_and_step(model, optimizers, scaler, cfg.grad_clip, step_loss)
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)

            # An fp16 gradient overflow is routine (the scaler backs off) until even a scale below 1
            # overflows; a non-finite loss or an unscaled non-finite gradient is a real problem.
            overflow_only = scaler is not None and math.isfinite(step_loss) and scaler.get_scale() >= 1.0
            if not applied and overflow_only:
                say(f"[portachat] step {step}: fp16 gradient overflow, update skipped; loss scale now {scaler.get_scale():g}")
            elif not applied:
                bad_steps += 1
                say(f"[portachat] step {step}: non-finite loss/gradient ({step_loss}); update skipped ({bad_steps} in a row)")
                if bad_steps >= cfg.max_bad_steps:
                    raise TrainingError(
                        f"training diverged: {bad_steps} steps in a row had a non-finite loss or gradient. "
                        "Lower the learning rates (e.g. --matrix-lr, --embedding-lr by 2-4x), keep gradient clipping on "
                        "(--grad-clip 1.0), prefer bf16 or fp32 over fp16 (--dtype), and check the data for "
                        f"garbage. The last good checkpoint is under {stage_path}; resume with --resume."
                    )
            else:
                bad_steps = 0
            dev.synchronize()
            dt = time.perf_counter() - t0
            total_time += dt
            step += 1
            last_loss = step_loss
            if step > start_step + 1:  # the first step pays compilation and warm-up
                dt_ema = dt if dt_ema is None else 0.9 * dt_ema + 0.1 * dt
            tok_per_s = tokens_per_step / dt
            mfu = flops_per_token * tok_per_s / (peak.value * world) if peak.value > 0 else None
            if mfu is not None and mfu > 1.0 and not warned_mfu:
                warned_mfu = True
                say(
                    f"[portachat] MFU above 100% means the {peak.source} peak ({peak.value / 1e12:.2f} TFLOPS) is too low, "
                    "e.g. measured while the machine was busy: run `portachat doctor --calibrate` on an idle machine."
                )
            mem = dev.memory()
            record = {
                "loss": step_loss,
                "lr_mult": lrm,
                "tok_per_s": tok_per_s,
                "mfu": mfu,
                "dt_s": dt,
                "grad_norm": grad_norm,
                "mem_bytes": mem.peak_allocated or mem.allocated,
            }
            show = env.is_main and (step % cfg.log_every == 0 or step == start_step + 1 or step == cfg.num_iterations)
            if show:  # telemetry may shell out to a vendor tool: only on logged steps
                tel = dev.telemetry()
                record.update(util_pct=tel.utilization_pct, temp_c=tel.temperature_c, power_w=tel.power_w)
            logger.log(step, record)
            if show:
                eta = (dt_ema or dt) * (cfg.num_iterations - step)
                say(format_progress(step, cfg.num_iterations, record, eta))

            save_due = cfg.save_every > 0 and step % cfg.save_every == 0 and step < cfg.num_iterations
            if save_due or stop_now:
                checkpoint(step, final_save=False)
            if stop_now:
                logger.close()
                raise KeyboardInterrupt(f"stopped at step {step}; resume with --resume")

    if world > 1:
        _check_replicas_in_sync(model, world, dev, say)
    final = checkpoint(step, final_save=True)
    logger.close()
    _barrier(world)
    return TrainResult(final_checkpoint=final, steps=step, val_bpb=val_bpb, samples=samples)


def _check_replicas_in_sync(model: GPT, world: int, dev: Device, say: Callable[[str], None]) -> None:
    """Data parallelism must keep every rank's weights bit-identical; verify it instead of assuming it."""
    with torch.no_grad():
        local = torch.stack([p.detach().double().sum() for p in model.parameters()])
    gathered = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(gathered, local)
    if not all(torch.equal(gathered[0], g) for g in gathered[1:]):
        raise TrainingError("the ranks' weights diverged: data-parallel replicas are out of sync (please report this)")
    say(f"[portachat] weights identical on all {world} ranks (checksum {gathered[0].sum().item():.6e})")


def _clip_and_step(model, optimizers, scaler, grad_clip: float, step_loss: float) -> tuple[bool, float | None]:
    """Clip and step every optimizer; returns (update applied, gradient norm).

    Without a scaler a non-finite loss or gradient skips the update here. With fp16's GradScaler the
    scaler itself skips an update whose gradients hold inf/NaN and lowers the loss scale, so the
    step always goes through it (calling update() without a step would be an error).
    """
    if scaler is None and not math.isfinite(step_loss):
        return False, None
    if scaler is not None:
        for opt in optimizers:
            scaler.unscale_(opt)
    grad_norm = None
    if grad_clip > 0:
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip).item()
    if scaler is None:
        if grad_norm is not None and not math.isfinite(grad_norm):
            return False, grad_norm
        for opt in optimizers:
            opt.step()
        return True, grad_norm
    scale_before = scaler.get_scale()
    for opt in optimizers:
        scaler.step(opt)
    scaler.update()
    return scaler.get_scale() >= scale_before, grad_norm  # a skipped step always lowers the scale


@torch.no_grad()
def _samples(model: GPT, tokenizer: Tokenizer, prompts: list[str], max_tokens: int, dev: Device, seed: int) -> list[str]:
    out = []
    stop = {tokenizer.bos_id, tokenizer.eos_id}
    was_training = model.training
    model.eval()
    for i, prompt in enumerate(prompts):
        ids = tokenizer.encode(prompt, prepend_bos=True)
        with dev.autocast():
            new = list(generate(model, ids, max_new_tokens=max_tokens, temperature=0.0, seed=seed + i, stop_ids=stop))
        out.append(prompt + tokenizer.decode([t for t in new if t not in stop]))
    model.train(was_training)
    return out


def _config_dict(cfg: TrainConfig) -> dict[str, Any]:
    d = asdict(cfg)
    d["optim"]["adam_betas"] = list(cfg.optim.adam_betas)
    return d


def _resume(
    path: Path,
    model: GPT,
    tokenizer: Tokenizer,
    optimizers: list[torch.optim.Optimizer],
    scaler,
    streams: list[BatchStream],
    dev: Device,
    env: DistEnv,
    accum: int,
    say: Callable[[str], None],
) -> tuple[int, float, dict[str, torch.Tensor] | None]:
    """Load weights, optimizer and data positions from a checkpoint; returns its step, the training
    time spent so far and this rank's saved RNG state (applied by the caller just before training)."""
    meta = read_meta(path)
    check_tokenizer_matches(tokenizer, model.config, meta, where=str(path))
    saved_cfg = read_config(path)
    if saved_cfg != model.config:
        raise TrainingError(
            f"cannot resume from {path}: it holds a different model ({saved_cfg}) than this run asks for "
            f"({model.config}). Drop --resume or use the same --depth / --max-seq-len as the run you continue."
        )
    load_weights_into(model, path)  # straight into the training model: no second copy on the device
    saved_scaler = load_optimizers(path, model, optimizers)
    if scaler is not None and saved_scaler:
        scaler.load_state_dict(saved_scaler)
    rng = load_rng(path, env.rank)
    positions = meta.get("data_position", {})
    num_streams = env.world_size * accum
    if positions.get("num_streams") == num_streams:
        for m, stream in enumerate(streams):
            stream.load_state_dict(positions["streams"][str(env.rank * accum + m)])
    else:
        say(
            f"[portachat] warning: the checkpoint read data as {positions.get('num_streams')} streams, this run uses "
            f"{num_streams} (devices x accumulation changed); data restarts from the beginning of each stream."
        )
    spent = float((meta.get("metrics") or {}).get("total_training_time_s") or 0.0)
    return int(meta["step"]), spent, rng
