"""`portachat export hf|gguf` as a user runs it: a real subprocess, exit codes, messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from export_testing import make_checkpoint


def run_cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "portachat", *args], capture_output=True, text=True, env=env)


@pytest.mark.slow
def test_export_hf_and_gguf_from_the_command_line(tmp_path, small_tokenizer):
    ckpt, _ = make_checkpoint(tmp_path / "ckpt", small_tokenizer)
    out = run_cli("export", "hf", "--model", str(ckpt), "--output", str(tmp_path / "serve"), "--dtype", "fp16")
    assert out.returncode == 0, out.stderr
    assert "vllm serve" in out.stdout
    assert json.loads((tmp_path / "serve" / "config.json").read_text())["torch_dtype"] == "float16"
    out = run_cli("export", "gguf", "--model", str(ckpt), "--output", str(tmp_path / "m.gguf"), "--type", "q8_0")
    assert out.returncode == 0, out.stderr
    assert "pre-tokenizer 'qwen2'" in out.stdout and (tmp_path / "m.gguf").is_file()


def test_export_errors_exit_non_zero_with_the_reason(tmp_path):
    out = run_cli("export", "gguf", "--model", str(tmp_path / "nope"), "--output", str(tmp_path / "m.gguf"))
    assert out.returncode == 1 and "no model at" in out.stderr
    assert not (tmp_path / "m.gguf").exists()
