"""The speedrun's stages in the order they run (torch-free: `portachat speedrun --help` lists them)."""

from __future__ import annotations

STAGES = ("tokenizer", "base", "mid", "sft", "rl", "eval")
