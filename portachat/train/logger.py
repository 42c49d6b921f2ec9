"""Training logs: one JSON line per event (easy to grep and plot) and TensorBoard scalars."""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path
from typing import Any

from portachat.i18n import _


class RunLogger:
    """Appends to `<stage>/log.jsonl` and `<stage>/tensorboard/`; a no-op on non-main ranks."""

    def __init__(self, stage_path: Path, enabled: bool = True) -> None:
        self.enabled = enabled
        self._tb = None
        self._lock = threading.Lock()  # the telemetry monitor logs from its own thread
        if not enabled:
            return
        stage_path.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(stage_path / "log.jsonl", "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        try:  # optional and slow to import (it pulls in tensorboard): only when logging is on
            from torch.utils.tensorboard import (
                SummaryWriter,  # deferred: loads tensorboard, only when logging
            )

            self._tb = SummaryWriter(log_dir=str(stage_path / "tensorboard"))
        except ImportError:  # tensorboard is a dependency, but logging must never stop training
            self._tb = None

    def log(self, step: int, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {"step": step, "time": time.time(), **values}
        with self._lock:
            if self._jsonl.closed:
                return
            self._jsonl.write(json.dumps(record) + "\n")
            self._jsonl.flush()
            if self._tb is not None:
                for key, value in values.items():
                    if isinstance(value, (int, float)) and value is not None and math.isfinite(value):
                        self._tb.add_scalar(key if "/" in key else f"train/{key}", value, step)

    def log_device(self, step: int, sample: dict[str, float]) -> None:
        """A TelemetryMonitor sample: memory, utilisation, temperature, power under device/ in TensorBoard."""
        self.log(step, {f"device/{key}": value for key, value in sample.items()})

    def log_text(self, step: int, tag: str, text: str) -> None:
        if self.enabled and self._tb is not None:
            self._tb.add_text(tag, text, step)

    def close(self) -> None:
        if not self.enabled:
            return
        with self._lock:
            self._jsonl.close()
            if self._tb is not None:
                self._tb.close()
                self._tb = None


def _duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def format_mfu(mfu: float | None) -> str:
    """MFU as the progress line shows it: never above 100% (that would mean the peak is wrong)."""
    if mfu is None or not math.isfinite(mfu):
        return "n/a (run portachat doctor --calibrate)"
    if mfu > 1.0:
        return "n/a (peak too low: portachat doctor --calibrate)"
    return f"{100 * mfu:.1f}%"


# Preference stages: TRL's reward accuracy and margin; RL stages: the mean reward and the reply length.
PROGRESS_REWARDS = ("rewards/accuracies", "rewards/margins", "reward", "response_length")


def format_progress(step: int, total: int, r: dict[str, Any], eta_s: float) -> str:
    """One line per logged step: what a user watching the run wants to see."""
    width = len(str(total))
    mfu = format_mfu(r.get("mfu"))
    mem = f"{r['mem_bytes'] / 2**30:.2f} GiB" if r.get("mem_bytes") else "n/a"
    device = ""
    if r.get("util_pct") is not None:
        device += f" | util {r['util_pct']:.0f}%"
    if r.get("temp_c") is not None:
        device += f" {r['temp_c']:.0f}C"
    if r.get("power_w") is not None:
        device += f" {r['power_w']:.0f}W"
    # tok/s and MFU count real tokens; the padding share says how much of the step's compute was not.
    padding = f" (pad {100 * r['padding']:.0f}%)" if r.get("padding") is not None else ""
    # Time the step waited for its batches: a loader stall shows here rather than as a slow model.
    wait = f" (load {1000 * r['loader_wait_s']:.0f} ms)" if r.get("loader_wait_s") is not None else ""
    rewards = "".join(f" | {k} {r[k]:.3f}" for k in PROGRESS_REWARDS if r.get(k) is not None)
    return (
        f"step {step:0{width}d}/{total} ({100 * step / total:5.1f}%) | loss {r['loss']:.4f}{rewards} | lr x{r['lr_mult']:.2f} | "
        f"{r['tok_per_s']:,.0f} tok/s{padding} | MFU {mfu} | mem {mem}{device} | {1000 * r['dt_s']:.0f} ms/step{wait} | "
        f"ETA {_duration(eta_s)}"
    )


def format_run_banner(stage: str, params: int, steps: int, tokens_per_step: int, device_batch_size: int,
                      tokens_per_batch: int | None, seq_len: int, world: int, accum: int, device: str, dtype: str,
                      peak_flops: float, peak_source: str) -> str:
    """The line a stage starts with: the model, the horizon, how a step's batch is made, the device."""
    return (
        f"[portachat] {stage}: "
        + (_("{params} params | {steps} steps x {tokens} tokens (batch {batch} x seq {seq_len} x {world} "
             "device(s) x {accum} accum) | {device} {dtype} | peak {tflops} TFLOPS ({source})") if not tokens_per_batch
           else _("{params} params | {steps} steps x up to {tokens} tokens ({budget} tokens per micro-batch, rows of "
                  "up to {seq_len} x {world} device(s) x {accum} accum) | {device} {dtype} | peak {tflops} TFLOPS "
                  "({source})")).format(
            params=f"{params:,}", steps=steps, tokens=f"{tokens_per_step:,}", batch=device_batch_size,
            budget=f"{tokens_per_batch or 0:,}", seq_len=seq_len, world=world, accum=accum, device=device, dtype=dtype,
            tflops=f"{peak_flops / 1e12:.2f}", source=peak_source)
        + " | " + _("MFU counts causal attention (half of full: what the kernel computes)")
    )
