"""The evaluations `portachat eval` runs, by name (torch-free: the command line lists them in `--help`)."""

from __future__ import annotations

TASKS = ("bpb", "synthetic", "gsm8k", "arc", "mmlu", "ceval", "cmmlu", "humaneval")
CHOICES = (*TASKS, "core", "all")  # "core": the CORE-style centred mean; "all": every task with local data
