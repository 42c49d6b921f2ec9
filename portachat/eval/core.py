"""A CORE-style summary: each task's accuracy centred on chance, then averaged.

centred = (accuracy - chance) / (1 - chance): 0 is random guessing, 1 is perfect, whatever the
number of options, so a 4-way multiple-choice task and an open-ended one weigh the same.
"""

from __future__ import annotations

from portachat.eval.report import EvalResult
from portachat.i18n import _


def centered(accuracy: float, chance: float) -> float:
    if not 0.0 <= chance < 1.0:
        raise ValueError(f"chance must be in [0, 1), got {chance}")
    return (accuracy - chance) / (1.0 - chance)


def core_score(results: list[EvalResult]) -> EvalResult:
    """The mean centred accuracy over the results that have a chance level (bpb has none)."""
    scored = {r.task: centered(r.value, r.chance) for r in results if r.chance is not None and r.task != "core"}
    if not scored:
        raise ValueError(_("no task results to summarise: run at least one of gsm8k, arc, mmlu, humaneval, "
                           "synthetic"))
    return EvalResult("core", "centered_mean", sum(scored.values()) / len(scored), len(scored), 0.0,
                      {"per_task": scored})
