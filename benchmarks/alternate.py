"""Timing two sides fairly: warm both, then run them ours, peer, peer, ours, ... (memory bandwidth and
clocks drift during a run; alternating spreads the drift over both sides) and take medians."""

from __future__ import annotations

import statistics
from collections.abc import Callable


def alternating_medians(timed: Callable[[str], float], warmup: int, steps: int,
                        sides: tuple[str, str] = ("ours", "peer")) -> dict[str, float]:
    """Median seconds per side; `timed(side)` runs one step of that side and returns its seconds.
    Each side runs `warmup` untimed steps first, then `steps` timed ones in the order A B B A."""
    first, second = sides
    for side in sides:
        for _ in range(warmup):
            timed(side)
    times: dict[str, list[float]] = {side: [] for side in sides}
    order = (first, second, second, first)
    for i in range(steps * 2):
        side = order[i % 4]
        times[side].append(timed(side))
    return {side: statistics.median(t) for side, t in times.items()}
