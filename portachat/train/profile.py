"""`portachat profile`: K training or decode steps under torch.profiler.

Writes a Chrome trace (open it in chrome://tracing or https://ui.perfetto.dev), prints the top
operators, and a step-time breakdown: data wait / forward / backward / optimizer / communication.
The phases are split by device synchronizations, which only this profiling run pays for.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.profiler import profile, record_function

from portachat.device import Device
from portachat.engine import SamplingParams
from portachat.engine.oneshot import engine_for
from portachat.i18n import _
from portachat.model import GPT, GPTConfig
from portachat.train.optim import OptimConfig, training_optimizers

PHASES = ("data", "forward", "backward", "optimizer", "communication")
# Collective ops by their generic names; the backend's own name (dev.dist_backend) is added per device.
COMM_MARKERS = ("allreduce", "all_reduce", "c10d", "reduce_scatter", "all_gather", "allgather", "broadcast")


@dataclass
class ProfileResult:
    mode: str
    steps: int
    trace_path: Path
    phase_ms: dict[str, float]  # median per step
    step_ms: float
    top_ops: str  # the profiler's table
    events: int
    notes: list[str] = field(default_factory=list)


def _timed(dev: Device, times: dict[str, list[float]], phase: str, fn: Callable[[], object]) -> object:
    dev.synchronize()
    start = time.perf_counter()
    with record_function(f"portachat.{phase}"):
        out = fn()
    dev.synchronize()
    times[phase].append(1000 * (time.perf_counter() - start))
    return out


def random_batches(cfg: GPTConfig, batch_size: int, seq_len: int, seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    while True:
        rows = torch.randint(0, cfg.vocab_size, (batch_size, seq_len + 1), generator=gen)
        yield rows[:, :-1], rows[:, 1:]


def _communication_ms(prof: profile, steps: int, backend: str) -> float:
    """Time in collective kernels/ops per step, from the profiler's own events (0 on one device)."""
    markers = (*COMM_MARKERS, backend.lower()) if backend and backend != "none" else COMM_MARKERS
    total_us = 0.0
    for evt in prof.key_averages():
        if any(marker in evt.key.lower() for marker in markers):
            total_us += max(getattr(evt, "device_time_total", 0.0) or 0.0, evt.cpu_time_total)
    return total_us / 1000 / max(steps, 1)


def profile_training(
    cfg: GPTConfig,
    dev: Device,
    out_dir: Path,
    batch_size: int,
    seq_len: int,
    steps: int = 3,
    warmup: int = 1,
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> ProfileResult:
    model = GPT(cfg).to(dev.torch_device)
    optimizers = training_optimizers(model, OptimConfig(), dev)
    runner = torch.compile(model) if dev.compile else model
    batches = batches or random_batches(cfg, batch_size, seq_len)
    times: dict[str, list[float]] = {p: [] for p in PHASES}

    def step() -> None:
        inputs, targets = _timed(dev, times, "data", lambda: tuple(
            t.to(dev.torch_device, non_blocking=True) for t in next(batches)))
        with dev.autocast():
            loss = _timed(dev, times, "forward", lambda: runner(inputs, targets))
        _timed(dev, times, "backward", loss.backward)

        def update() -> None:
            for opt in optimizers:
                opt.step()
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)

        _timed(dev, times, "optimizer", update)

    return _run(dev, out_dir, "train", step, steps, warmup, times)


def profile_decode(
    cfg: GPTConfig, dev: Device, out_dir: Path, batch_size: int, prompt_len: int, steps: int = 8, warmup: int = 2
) -> ProfileResult:
    """Engine decode steps (paged KV cache, greedy): every sequence gains one token per step after
    the prompts' prefill, which runs first and is not profiled."""

    model = GPT(cfg).to(device=dev.torch_device, dtype=dev.dtype).requires_grad_(False)
    # One more token than the steps take: no sequence finishes (and frees its blocks) mid-profile.
    new_tokens = warmup + steps + 2
    engine = engine_for(model, device=dev, max_num_seqs=batch_size, max_model_len=prompt_len + new_tokens,
                        max_num_batched_tokens=batch_size * prompt_len)
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    gen = torch.Generator().manual_seed(0)
    for _i in range(batch_size):
        engine.add_request(torch.randint(0, cfg.vocab_size, (prompt_len,), generator=gen).tolist(), params)
    engine.step()  # every prompt's prefill, in one step: the token budget holds them all
    times: dict[str, list[float]] = {p: [] for p in PHASES}
    # The runner's two calls within a step, timed in place: what remains of the step is the engine's.
    runner = engine.runner
    prepare, forward = runner.prepare, runner.forward
    runner.prepare = lambda batch: _timed(dev, times, "data", lambda: prepare(batch))
    runner.forward = lambda inputs: _timed(dev, times, "forward", lambda: forward(inputs))

    def step() -> None:
        outputs = engine.step()
        if len(outputs) != batch_size:
            raise RuntimeError(f"a decode step sampled {len(outputs)} of {batch_size} sequences")

    result = _run(dev, out_dir, "decode", step, steps, warmup, times)
    result.notes.append("decode: 'data' is the step's inputs built on the host and copied to the device; "
                        "'other' is scheduling, sampling and per-sequence bookkeeping")
    return result


def _run(dev: Device, out_dir: Path, mode: str, step: Callable[[], None], steps: int, warmup: int,
         times: dict[str, list[float]]) -> ProfileResult:
    for _i in range(warmup):
        step()
    for values in times.values():
        values.clear()
    out_dir.mkdir(parents=True, exist_ok=True)
    trace_path = out_dir / f"trace_{mode}.json"
    step_times: list[float] = []
    with profile(activities=dev.profiler_activities(), record_shapes=True, profile_memory=False) as prof:
        for _ in range(steps):
            start = time.perf_counter()
            with record_function("portachat.step"):
                step()
            dev.synchronize()
            step_times.append(1000 * (time.perf_counter() - start))
    prof.export_chrome_trace(str(trace_path))
    device_sort = "device_time_total" if len(dev.profiler_activities()) > 1 else "self_cpu_time_total"
    top = prof.key_averages().table(sort_by=device_sort, row_limit=15, max_name_column_width=48)
    phase_ms = {p: statistics.median(v) if v else 0.0 for p, v in times.items()}
    phase_ms["communication"] = _communication_ms(prof, steps, dev.dist_backend)
    events = len(json.loads(trace_path.read_text()).get("traceEvents", []))
    return ProfileResult(mode, steps, trace_path, phase_ms, statistics.median(step_times), top, events)


def format_breakdown(result: ProfileResult) -> str:
    total = result.step_ms
    lines = [_("step-time breakdown ({mode}, median of {steps} steps: {ms} ms/step)").format(
        mode=result.mode, steps=result.steps, ms=f"{total:,.1f}")]
    for phase in PHASES:
        ms = result.phase_ms.get(phase, 0.0)
        if result.mode == "decode" and phase in ("backward", "optimizer"):
            continue
        share = 100 * ms / total if total > 0 else 0.0
        lines.append(f"  {phase:14} {ms:10.2f} ms  {share:5.1f}%")
    # Communication overlaps backward under DDP, so it is not subtracted again.
    other = total - sum(ms for phase, ms in result.phase_ms.items() if phase != "communication")
    lines.append(f"  {'other':14} {max(other, 0.0):10.2f} ms  {100 * max(other, 0.0) / total if total else 0:5.1f}%")
    lines += ["  " + _("note: {note}").format(note=n) for n in result.notes]
    return "\n".join(lines)
