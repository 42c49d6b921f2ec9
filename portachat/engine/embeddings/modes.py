"""The pooling modes an embedding model can use (torch-free: `portachat serve --help` lists them)."""

from __future__ import annotations

POOLING_MODES = ("mean", "cls", "last", "max", "mean_sqrt_len")
