"""`portachat tune batch-size` and `--device-batch-size auto`: the largest device batch that fits, found
by running real steps.

Each probe (measure_training_peak: a model trained from scratch; train/finetune_batch.py: a loaded
model as fine-tuning, DPO or distillation trains it) runs forward + backward + optimizer steps of the
model and its real optimizers at one batch size and records the peak memory; an out-of-memory error
from any vendor (recognised by the diagnosis table) or a peak above the limit times a safety margin
means "does not fit". Batch sizes double until one fails, then a binary search (search_batch_size)
narrows the gap. Everything is freed between probes.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist

from portachat.device import Device, DistEnv
from portachat.device.errors import diagnose
from portachat.device.memtrack import LiveTensorBytes
from portachat.i18n import _
from portachat.model import GPT, GPTConfig
from portachat.train.accumulation import grad_accum_steps, largest_dividing_batch
from portachat.train.activation_checkpointing import apply_activation_checkpointing
from portachat.train.config import TrainConfig
from portachat.train.optim import OptimConfig, training_optimizers


@dataclass
class Probe:
    batch_size: int
    fits: bool
    peak_bytes: int | None  # None when it ran out of memory
    note: str = ""


@dataclass
class BatchSizeResult:
    batch_size: int  # 0 when not even batch 1 fits
    limit_bytes: int
    safety: float
    probes: list[Probe] = field(default_factory=list)

    def batch_for_total(self, total_batch_tokens: int | None, seq_len: int, world_size: int = 1) -> tuple[int, int]:
        """(device batch, accumulation steps) for an exact `total_batch_tokens`: the largest batch that fits
        and divides the total (what `--device-batch-size auto` trains with)."""
        batch = largest_dividing_batch(self.batch_size, total_batch_tokens, seq_len, world_size)
        return batch, grad_accum_steps(total_batch_tokens, batch, seq_len, world_size)


def is_out_of_memory(exc: BaseException) -> bool:
    """Any vendor's OOM: torch.OutOfMemoryError, MemoryError, or a message the diagnosis table knows."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    found = diagnose(exc)
    return found is not None and found.rule.startswith("Out of memory")


def measure_peak(run: Callable[[], None], dev: Device, resident_bytes: int = 0, collect_garbage: bool = True) -> int:
    """Peak bytes of live tensors while `run()` runs training steps (it frees what it made when it returns).

    Accelerators report their allocator's high-water mark, which counts what was already resident (a
    loaded model); on CPU a dispatch-mode counter tracks every tensor `run` creates (the process RSS would
    include the allocator's and libraries' own memory), plus `resident_bytes` for the tensors that were
    there before and stay. `collect_garbage`: run a full garbage collection after (a caller whose steps
    leave no tensor in a reference cycle may skip its cost; a failed probe is always collected)."""
    tracker = None if dev.allocator_tracks_peaks else LiveTensorBytes()
    if tracker is None:
        dev.synchronize()
        dev.reset_peak_memory()
    else:
        tracker.__enter__()
    try:
        run()
        dev.synchronize()
        if tracker is not None:
            return tracker.peak + resident_bytes
        peak = dev.memory().peak_allocated
        if peak is None:
            raise RuntimeError(_("{kind} reports no peak memory; pass --memory-limit and run on CPU to tune").format(
                kind=dev.kind))
        return int(peak)
    finally:
        if tracker is not None:
            tracker.__exit__(None, None, None)
        cleanup(dev, collect_garbage)


def measure_training_peak(
    cfg: GPTConfig,
    batch_size: int,
    seq_len: int,
    dev: Device,
    activation_checkpointing: bool = False,
    steps: int = 2,
) -> int:
    """Peak bytes over real training steps of a new GPT, model and optimizer state included."""

    def run() -> None:
        model = GPT(cfg).to(dev.torch_device)
        if activation_checkpointing:
            apply_activation_checkpointing(model)
        optimizers = training_optimizers(model, OptimConfig(), dev)
        gen = torch.Generator().manual_seed(0)
        batch = torch.randint(0, cfg.vocab_size, (batch_size, seq_len + 1), generator=gen).to(dev.torch_device)
        inputs, targets = batch[:, :-1], batch[:, 1:]
        for _step in range(steps):
            with dev.autocast():
                loss = model(inputs, targets)
            loss.backward()
            for opt in optimizers:
                opt.step()
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            del loss

    return measure_peak(run, dev)


def cleanup(dev: Device, collect_garbage: bool = True) -> None:
    if collect_garbage:
        gc.collect()
    dev.empty_cache()


def search_batch_size(
    measure: Callable[[int], int],
    dev: Device,
    memory_limit: int | None = None,
    safety: float = 0.9,
    max_batch_size: int = 1024,
    say: Callable[[str], None] = lambda _msg: None,
) -> BatchSizeResult:
    """Largest batch size whose peak, `measure(batch size)` (real steps), stays under `safety * limit`
    (limit: `memory_limit`, else the device's total memory) and that does not run out of memory."""
    if not 0 < safety <= 1:
        raise ValueError(_("safety must be in (0, 1], got {safety}").format(safety=safety))
    limit = memory_limit if memory_limit is not None else dev.memory().total
    if not limit:
        raise ValueError(_("{kind} does not report its memory size; pass --memory-limit").format(kind=dev.kind))
    budget = safety * limit
    result = BatchSizeResult(0, int(limit), safety)

    def fits(b: int) -> bool:
        peak: int | None = None
        try:
            peak = measure(b)
        except Exception as exc:  # any vendor's OOM; anything else is a real error
            if not is_out_of_memory(exc):
                raise
        if peak is None:
            cleanup(dev)  # out of the except block: the failed probe's frames (and tensors) are gone
            result.probes.append(Probe(b, False, None, "out of memory"))
            say(_("batch {b}: out of memory").format(b=f"{b:5d}"))
            return False
        ok = peak <= budget
        result.probes.append(Probe(b, ok, peak, "" if ok else "above the limit"))
        verdict = _("batch {b}: peak {peak} MiB fits {budget} MiB ({pct}% of {limit} MiB)") if ok else \
            _("batch {b}: peak {peak} MiB exceeds {budget} MiB ({pct}% of {limit} MiB)")
        say(verdict.format(b=f"{b:5d}", peak=f"{peak / 2**20:,.1f}", budget=f"{budget / 2**20:,.1f}",
                           pct=f"{100 * safety:.0f}", limit=f"{limit / 2**20:,.1f}"))
        return ok

    good, bad = 0, None
    b = 1
    while b <= max_batch_size:  # doubling
        if fits(b):
            good, b = b, b * 2
        else:
            bad = b
            break
    if bad is None:
        result.batch_size = good
        return result
    while bad - good > 1:  # binary search between the last fit and the first failure
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    result.batch_size = good
    return result


def find_batch_size(
    cfg: GPTConfig,
    seq_len: int,
    dev: Device,
    memory_limit: int | None = None,
    safety: float = 0.9,
    max_batch_size: int = 1024,
    activation_checkpointing: bool = False,
    say: Callable[[str], None] = lambda _msg: None,
) -> BatchSizeResult:
    """search_batch_size over a new GPT of `cfg` trained from scratch (Muon + AdamW) on rows of seq_len."""
    return search_batch_size(lambda b: measure_training_peak(cfg, b, seq_len, dev, activation_checkpointing), dev,
                             memory_limit=memory_limit, safety=safety, max_batch_size=max_batch_size, say=say)


def parse_device_batch_size(text: str) -> int | str:
    """`--device-batch-size` value: a positive integer or "auto" (find it with find_batch_size)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(_("--device-batch-size must be a positive integer or auto, got {text}").format(text=repr(text)))
    return value


def batch_for_budget(
    measure: Callable[[int], int],
    seq_len: int,
    dev: Device,
    total_batch_tokens: int | None,
    world_size: int = 1,
    memory_limit: int | None = None,
    say: Callable[[str], None] = lambda _msg: None,
    max_batch_size: int = 1024,
) -> tuple[BatchSizeResult, int, int]:
    """(the search, device batch size, gradient accumulation steps): the largest batch that fits
    (search_batch_size over `measure`), capped so one optimizer step does not exceed
    `total_batch_tokens` (each unit of batch counted as seq_len tokens, as the step's total is) and
    dividing it, and at most `max_batch_size`; accumulation makes up the rest. Batch 0 when not even 1 fits."""
    cap = max(1, total_batch_tokens // (seq_len * world_size)) if total_batch_tokens else max_batch_size
    cap = min(cap, max_batch_size)
    found = search_batch_size(measure, dev, memory_limit=memory_limit, max_batch_size=cap, say=say)
    if found.batch_size == 0:
        return found, 0, 0
    return found, *found.batch_for_total(total_batch_tokens, seq_len, world_size)


def auto_device_batch_size(
    cfg: GPTConfig,
    seq_len: int,
    dev: Device,
    total_batch_tokens: int | None,
    world_size: int = 1,
    memory_limit: int | None = None,
    activation_checkpointing: bool = False,
    say: Callable[[str], None] = lambda _msg: None,
    row_len: int | None = None,
) -> tuple[int, int]:
    """(device batch size, gradient accumulation steps) for `--device-batch-size auto` of a model trained
    from scratch (batch_for_budget over measure_training_peak). Under torchrun every rank must use the
    same value: take the minimum over ranks before training. `row_len`: how long a padded row of the
    data really gets (chat data: its longest conversation's bucket), probed instead of seq_len;
    accumulation still counts seq_len per row, as the step's token total does."""
    probe_len = min(row_len or seq_len, seq_len)
    if probe_len < seq_len:
        say(_("probing rows of {n} tokens: the data's longest, padded (--max-seq-len {seq_len})").format(
            n=probe_len, seq_len=seq_len))
    found, batch, accum = batch_for_budget(
        lambda b: measure_training_peak(cfg, b, probe_len, dev, activation_checkpointing), seq_len, dev,
        total_batch_tokens, world_size, memory_limit, say)
    if batch == 0:
        raise ValueError(
            _("not even --device-batch-size 1 fits in {gib} GiB at --max-seq-len {seq_len}; "
              "use a smaller --depth or --max-seq-len").format(gib=f"{found.limit_bytes / 2**30:.2f}", seq_len=probe_len)
        )
    say(_("--device-batch-size auto: {batch} per device, {accum} accumulation step(s)").format(batch=batch, accum=accum))
    return batch, accum


def resolve_auto(cfg: TrainConfig, dev: Device, env: DistEnv, say: Callable[[str], None], choose: Callable[[], int],
                 chosen: str | None = None) -> TrainConfig:
    """`--device-batch-size auto` made a number: `choose()` (this rank's largest batch that fits), the
    smallest over ranks; with --tokens-per-batch the budget bounds each micro-batch and nothing is probed.
    `chosen`: the closing line ({batch}, {accum}), rows per device unless the stage counts otherwise."""
    if cfg.device_batch_size != "auto":
        return cfg
    if cfg.tokens_per_batch is not None:  # rows are drawn by the budget: the batch size is not used
        say("[portachat] " + _("--device-batch-size auto: not used, --tokens-per-batch {n} sets each micro-batch").format(
            n=cfg.tokens_per_batch))
        return replace(cfg, device_batch_size=1)
    batch = choose()
    if env.world_size > 1:  # every rank must run the same shapes: the smallest device decides
        t = torch.tensor([batch], device=dev.torch_device if dist.get_backend() != "gloo" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        batch = int(t.item())
    cfg = replace(cfg, device_batch_size=batch)
    line = chosen or _("--device-batch-size auto: {batch} rows per device, {accum} accumulation step(s)")
    say("[portachat] " + line.format(batch=batch, accum=cfg.grad_accum_steps(env.world_size)))
    return cfg


def resolve_device_batch_size(cfg: TrainConfig, model: GPT, dev: Device, env: DistEnv, say: Callable[[str], None],
                              row_len: Callable[[], int] | None = None) -> TrainConfig:
    """Turn `--device-batch-size auto` into the largest batch that fits (real steps of a model of this
    shape trained from scratch on this device), the same on every rank, and dividing --total-batch-size
    so accumulation is exact. `row_len`: the padded length the data's rows really reach (chat data),
    probed instead of --max-seq-len."""
    return resolve_auto(cfg, dev, env, say, lambda: auto_device_batch_size(
        model.config, cfg.max_seq_len, dev, cfg.total_batch_size, env.world_size,
        activation_checkpointing=cfg.activation_checkpointing, say=say,
        row_len=row_len() if row_len is not None else None)[0])
