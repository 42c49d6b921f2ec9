"""--kv-cache-dtype on the inference commands: int8 runs, fp8 on a CPU stops with what works instead."""

from __future__ import annotations

import pytest
import torch

from portachat.cli import build_parser, main
from portachat.model import GPT, GPTConfig
from portachat.model.model_dir import save_model_files


@pytest.fixture()
def checkpoint(tmp_path, small_tokenizer):
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=small_tokenizer.vocab_size, n_layer=1, n_embd=64, n_head=4, n_kv_head=2,
                    head_dim=16, intermediate_size=128, max_seq_len=64)  # fmt: skip
    path = tmp_path / "tiny"
    path.mkdir()
    save_model_files(path, GPT(cfg), small_tokenizer, {"stage": "sft", "step": 1})
    return path


def test_serve_generate_and_chat_accept_every_kv_cache_dtype():
    parser = build_parser()
    for command in (["serve"], ["chat"], ["generate", "--input", "i.jsonl", "--output", "o.jsonl"]):
        args = parser.parse_args([*command, "--model", "m", "--kv-cache-dtype", "int8"])
        assert args.kv_cache_dtype == "int8"
        assert parser.parse_args([*command, "--model", "m"]).kv_cache_dtype == "auto"
        with pytest.raises(SystemExit):
            parser.parse_args([*command, "--model", "m", "--kv-cache-dtype", "int4"])


def test_chat_runs_on_an_int8_cache_and_fp8_on_a_cpu_names_the_alternatives(checkpoint, capsys):
    run = ["chat", "--model", str(checkpoint), "--device", "cpu", "--dtype", "fp32", "--prompt", "Hello",
           "--max-tokens", "3", "--temperature", "0", "--kv-cache-gb", "0.001"]  # fmt: skip
    assert main([*run, "--kv-cache-dtype", "int8"]) == 0
    assert "KV cache int8" in capsys.readouterr().err
    assert main([*run, "--kv-cache-dtype", "fp8"]) == 1
    err = capsys.readouterr().err
    assert "fp8 needs native fp8" in err and "int8" in err and "Traceback" not in err
