"""Benchmarks are not tests, but they must keep running: a tiny smoke run of each."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.smollm2 import smollm2_gguf_path

pytestmark = pytest.mark.slow


def test_train_throughput_prints_a_ratio():
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "train_throughput.py"), "--depth", "1", "--seq-len", "32",
         "--batch-size", "2", "--steps", "2", "--warmup", "1", "--vocab-size", "512", "--json"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ratio (ours / reference tok/s):" in proc.stdout
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record["ratio"] > 0 and record["results"]["portachat"]["tok_per_s"] > 0
    # MFU's peak is the dtype's that runs, never below a matmul rate this run sustained in that dtype
    assert record["matmul_flops_measured"] > 0
    assert math.isnan(record["peak_flops"]) or record["peak_flops"] >= record["matmul_flops_measured"]


def test_decode_benchmark_prints_ratios():
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "decode.py"), "--models", "ours", "--depth", "1",
         "--batch-sizes", "1,2", "--new-tokens", "4", "--rounds", "1", "--threads", "1", "--json"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(record["results"]) == 2
    assert all(r["ratio"] > 0 for r in record["results"])
    # MBU against the bandwidth measured in this run, between the timed rounds
    assert all(r["mbu"] > 0 and r["bandwidth"] > 1e8 for r in record["results"])
    assert "MBU" in proc.stdout and "GB/s" in proc.stdout


def test_kv_cache_dtype_benchmark_prints_ratios_against_fp32(shakespeare_path):
    smollm2_gguf_path()  # skips (fails under CI) without the model
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "kv_cache_dtype.py"), "--text", str(shakespeare_path),
         "--tokens", "96", "--segment", "48", "--kv-dtypes", "fp32", "int8", "--json"],
        capture_output=True, text=True, timeout=300, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    fp32, int8 = json.loads(proc.stdout.strip().splitlines()[-1])["rows"]
    assert fp32["capacity_vs_fp32"] == 1.0 and 3.5 < int8["capacity_vs_fp32"] < 4
    assert abs(int8["perplexity_vs_fp32"] - 1) < 0.02 and int8["speed_vs_fp32"] > 0


def test_muon_split_benchmark_prints_a_ratio():
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "muon_split.py"), "--nproc", "2", "--depth", "1", "--steps", "2",
         "--warmup", "1", "--json"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["ratio"] > 0


def test_retrieval_benchmark_finds_the_answering_document_first_for_most_queries():
    from tests.minilm import minilm_dir

    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "retrieval.py"), "--embedding-model",
                           str(minilm_dir()), "--json"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["documents"] == 30 and result["queries"] == 20
    assert result["top1"] >= 0.8 and result["top1_zh"] >= 0.7, result["misses"]
    assert result["top1"] > result["top1_vector_only"]  # the keyword ranking earns its place


def test_vector_store_benchmark_runs():
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "vector_stores.py"), "--n", "500",
                           "--queries", "5", "--json"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["faiss-cpu"]["recall@1"] == 1.0


def test_lora_batch_benchmark_prints_ratios_and_equal_outputs():
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "lora_batch.py"), "--depth", "1", "--adapters", "2",
         "--requests-per-adapter", "2", "--prompt-len", "8", "--new-tokens", "4", "--rounds", "1", "--threads", "1",
         "--json"],
        capture_output=True, text=True, timeout=300, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record["ratio"] > 0 and record["equal_outputs"] == record["requests"] == 4
def test_decode_benchmark_against_llama_cpp_per_width():
    pytest.importorskip("cyllama.llama.llama_cpp", reason="llama.cpp bindings: pip install cyllama")
    gguf = smollm2_gguf_path()
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "decode.py"), "--models", "", "--llama-cpp", "--widths",
         "bf16,int4", "--new-tokens", "4", "--rounds", "1", "--ttft-prompt-len", "40", "--threads", "1", "--json"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "prebuilt llama.cpp — not the speed reference" in proc.stdout
    bf16, int4 = json.loads(proc.stdout.strip().splitlines()[-1])["llama_cpp"]
    # each width against its llama.cpp type, both sides on one file: the shipped q4_1, an f16 twin of it
    assert (bf16["gguf"], int4["gguf"]) == ("f16", "q4_1")
    assert int4["file"] == gguf.name and bf16["file"].endswith(".f16.gguf")
    for rec in (bf16, int4):
        assert rec["ours_tok_s"] > 0 and rec["cyllama_tok_s"] > 0 and rec["ratio_vs_cyllama"] > 0
        assert rec["ours_ttft_s"] > 0 and rec["ttft_ratio_vs_cyllama"] > 0 and 0 < rec["mbu"] < 1
        assert "llama-server_tok_s" not in rec  # no native binary given, no native figure


@pytest.mark.skipif(not os.environ.get("LLAMA_SERVER"), reason="set LLAMA_SERVER to a native llama-server binary")
def test_decode_benchmark_against_native_llama_server():
    smollm2_gguf_path()
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "decode.py"), "--models", "", "--llama-server",
         os.environ["LLAMA_SERVER"], "--widths", "bf16", "--new-tokens", "4", "--rounds", "1",
         "--ttft-prompt-len", "40", "--threads", "1", "--json"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    (rec,) = json.loads(proc.stdout.strip().splitlines()[-1])["llama_cpp"]
    assert rec["llama-server_tok_s"] > 0 and rec["llama-server_ttft_s"] > 0 and rec["ratio_vs_llama-server"] > 0


@pytest.mark.parametrize("tp, dp", [(2, 1), (1, 2)])
def test_serve_benchmark_compares_parallel_servers_with_one(tp, dp):
    smollm2_gguf_path()
    label = f"tp{tp} dp{dp}"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "serve.py"), "--tensor-parallel-size", str(tp),
         "--data-parallel-size", str(dp), "--dtype", "fp32", "--rounds", "1", "--concurrency", "4", "--sequential", "1",
         "--max-tokens", "4", "--max-model-len", "256", "--threads", "1", "--json"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(record["ratios"]) == {"tp1 dp1", label}
    (runs,) = record["rounds"]
    assert all(r["runs"][r["concurrent"]]["ok"] == 4 for r in runs.values())
    assert record["parallel_ratio_concurrent"] > 0 and record["parallel_ratio_sequential"] > 0
    assert record["greedy_identical"] == 4  # fp32: the split model answers as the whole one
    assert record["left_running"] == {"tp1 dp1": 0, label: 0}
    assert f"checks that {label} serves correctly" in proc.stdout


def test_speculative_benchmark_reports_each_task():
    smollm2_gguf_path()  # skips (fails under CI) without the model
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "speculative.py"), "--rounds", "1", "--max-tokens", "12",
         "--tasks", "edit", "--dtype", "fp32", "--threads", "1", "--json"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "differ from plain decoding" not in proc.stdout  # fp32: identical greedy replies
    results = json.loads(proc.stdout.strip().splitlines()[-1])["results"]
    assert set(results) == {"edit", "all"}
    edit = results["edit"]
    assert edit["plain"]["ratio"] == 1.0 and edit["ngram"]["tok_s"] > 0 and edit["draft"]["tok_s"] > 0
    # correcting a paragraph copies it: most prompt-lookup drafts are accepted
    assert edit["ngram"]["acceptance"] > 0.5 and edit["ngram"]["tokens_per_step"] > 2
    # a target and a draft given by path (a speedrun pair's form): the target drafting for itself agrees always
    gguf = str(smollm2_gguf_path())
    given = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "speculative.py"), "--model", gguf, "--draft", gguf, "--rounds", "1",
         "--max-tokens", "6", "--tasks", "edit", "--dtype", "fp32", "--threads", "1", "--json"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert given.returncode == 0, given.stderr[-2000:]
    assert json.loads(given.stdout.strip().splitlines()[-1])["results"]["edit"]["draft"]["acceptance"] == 1.0
    missing = subprocess.run([sys.executable, str(REPO / "benchmarks" / "speculative.py"), "--model", "no/such/run"],
                             capture_output=True, text=True, timeout=300, cwd=REPO)  # fmt: skip
    assert missing.returncode != 0 and "no model at no/such/run" in missing.stderr
    unknown = subprocess.run([sys.executable, str(REPO / "benchmarks" / "speculative.py"), "--tasks", "poem"],
                             capture_output=True, text=True, timeout=300, cwd=REPO)  # fmt: skip
    assert unknown.returncode != 0 and "unknown tasks ['poem']" in unknown.stderr


def test_rl_rollouts_benchmark_prints_a_ratio():
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "rl_rollouts.py"), "--models", "ours", "--depth", "1",
         "--prompts", "2", "--group", "2", "--prompt-len", "20", "--new-tokens", "4", "--rounds", "1",
         "--threads", "1", "--json"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(proc.stdout.strip().splitlines()[-1])["results"][0]
    assert record["ratio"] > 0 and record["ours_tok_s"] > 0 and record["hf_tok_s"] > 0
    assert record["prefix_hits"] > 0  # the G replies shared their prompt's blocks


def test_dpo_benchmark_prints_a_ratio_against_trl():
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "dpo.py"), "--tiny", "--device", "cpu", "--json"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ratio (TRL / ours step time):" in proc.stdout
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record["ratio"] > 0 and record["ours_ms"] > 0 and record["peer_ms"] > 0


def test_align_benchmark_reports_held_out_accuracy_before_and_after(tmp_path):
    """The DPO side (prefs, train dpo --merge, both evaluations); the GRPO side shares all but the command,
    which tests/train covers, and CI's time budget pays for one."""
    method = "dpo"
    smollm2_gguf_path()  # skips (fails under CI) without the model
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "align_smollm2.py"), "--method", method, "--train-prompts", "24",
         "--eval-questions", "4", "--steps", "1", "--batch-size", "8", "--max-new-tokens", "16",
         "--workdir", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=600, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert 0 <= record["accuracy_before"] <= 1 and 0 <= record["accuracy_after"] <= 1
    assert record["steps"] == 1 and (tmp_path / "heldout.jsonl").is_file()
    assert record["pairs"] > 0 and 0 <= record["named_one_of_two_after"] <= 1


def test_packed_attention_benchmark_prints_a_ratio_and_agrees_with_its_peer():
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "packed_attention.py"), "--batch-size", "2", "--seq-len", "64",
         "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--layers", "2", "--mean-conversation", "20",
         "--steps", "2", "--warmup", "1", "--json"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record["ratio"] > 0 and record["conversations"] > 2
    assert record["path"] == "dense_mask" and record["max_abs_diff"] < 1e-5  # fp32 on a CPU: the same mask
