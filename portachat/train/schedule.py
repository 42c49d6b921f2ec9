"""Learning-rate and momentum schedules: linear warmup, constant, linear warmdown (nanochat's)."""

from __future__ import annotations


def lr_multiplier(step: int, total_steps: int, warmup_ratio: float, warmdown_ratio: float, final_frac: float) -> float:
    """Multiplier on each group's initial lr at optimizer step `step` (0-based) of `total_steps`."""
    warmup = round(warmup_ratio * total_steps)
    warmdown = round(warmdown_ratio * total_steps)
    if step < warmup:
        return (step + 1) / warmup
    if step <= total_steps - warmdown:
        return 1.0
    progress = max(0.0, (total_steps - step) / max(warmdown, 1))
    return progress + (1 - progress) * final_frac


def muon_momentum(step: int, warmup_steps: int = 300, start: float = 0.85, end: float = 0.95) -> float:
    """Muon momentum ramps up over the first steps: early updates follow the fresh gradient more."""
    frac = min(step / warmup_steps, 1.0) if warmup_steps > 0 else 1.0
    return (1 - frac) * start + frac * end
