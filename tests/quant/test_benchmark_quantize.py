"""benchmarks/quantize.py keeps running: a tiny smoke run on one of our checkpoints (slow: a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from portachat.model import GPT, GPTConfig
from portachat.model.model_dir import save_model_files
from portachat.storage.atomic import atomic_directory
from tests.conftest import REPO

pytestmark = pytest.mark.slow


def test_quantize_benchmark_prints_every_variant(tmp_path, small_tokenizer, shakespeare_path):
    cfg = GPTConfig(vocab_size=384, n_layer=1, n_embd=64, n_head=2, n_kv_head=1, head_dim=32,
                    intermediate_size=192, max_seq_len=128)  # fmt: skip
    model = GPT(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.1)
    with atomic_directory(tmp_path / "ckpt") as tmp:
        save_model_files(tmp, model, small_tokenizer, {})
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "quantize.py"), "--model", str(tmp_path / "ckpt"),
         "--text", str(shakespeare_path), "--ppl-chars", "1500", "--ctx", "64", "--decode-tokens", "4",
         "--rounds", "1", "--threads", "1", "--json"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])["results"]
    assert set(results) == {"fp32", "bf16", "int8", "int4"}
    assert results["int8"]["memory_vs_bf16"] > 1.5 and results["int4"]["weight_bytes"] < results["int8"]["weight_bytes"]
    assert all(r["decode_tok_s"] > 0 and r["ppl"] > 1 for r in results.values())
