from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys

import pytest

from portachat.cli import main


@pytest.fixture(scope="module")
def checkpoint(tool_model, small_tokenizer, tmp_path_factory):
    from portachat.model.model_dir import save_model_files

    model, _ = tool_model
    path = tmp_path_factory.mktemp("ckpt") / "sft"
    path.mkdir()
    save_model_files(path, model, small_tokenizer, {"stage": "sft", "step": 1})
    return path


def run_json(capsys, *argv) -> dict:
    assert main(["eval", *argv, "--json"]) == 0
    return {r["task"]: r for r in json.loads(capsys.readouterr().out)["results"]}


def test_generative_and_categorical_tasks_through_the_cli(checkpoint, capsys, gsm8k_test_path, tmp_path):
    r = run_json(capsys, "synthetic", "--model", str(checkpoint), "--limit", "4", "--max-tokens", "24", "--device", "cpu")
    assert r["synthetic"]["n"] == 4 and 0.0 <= r["synthetic"]["value"] <= 1.0
    r = run_json(capsys, "gsm8k", "--model", str(checkpoint), "--data", str(gsm8k_test_path), "--limit", "2",
                 "--max-tokens", "8", "--device", "cpu")
    assert r["gsm8k"]["n"] == 2
    arc = tmp_path / "arc.jsonl"
    arc.write_text(json.dumps({"question": "Q?", "answerKey": "B", "choices": {"text": ["x", "y"], "label": ["A", "B"]}})
                   + "\n")
    r = run_json(capsys, "arc", "--model", str(checkpoint), "--data", str(arc), "--device", "cpu")
    assert r["arc"]["n"] == 1 and r["arc"]["chance"] == 0.5
    r = run_json(capsys, "bpb", "--model", str(checkpoint), "--limit", "2", "--device", "cpu")
    assert r["bpb"]["metric"] == "bits_per_byte" and r["bpb"]["value"] > 0


def test_humaneval_and_all_with_core(checkpoint, capsys, humaneval_path, tmp_path, monkeypatch):
    r = run_json(capsys, "humaneval", "--model", str(checkpoint), "--data", str(humaneval_path), "--limit", "2",
                 "--max-tokens", "8", "--device", "cpu", "--workers", "2")
    assert r["humaneval"]["n"] == 2 and r["humaneval"]["value"] == 0.0  # a 3-conversation model writes no code
    # `all` finds data under $PORTACHAT_HOME/eval_data/<task> and skips what is absent
    home = tmp_path / "home"
    monkeypatch.setenv("PORTACHAT_HOME", str(home))
    (home / "eval_data" / "humaneval").mkdir(parents=True)
    with gzip.open(humaneval_path, "rt") as src, open(home / "eval_data" / "humaneval" / "he.jsonl", "w") as dst:
        dst.write(src.readline())
    assert main(["eval", "all", "--model", str(checkpoint), "--limit", "2", "--max-tokens", "8", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "skipped, no data" in out and "gsm8k" in out
    table = out[re.search(r"^task +metric", out, re.M).start():]
    for task in ("bpb", "synthetic", "humaneval", "core"):
        assert task in table
    assert "arc " not in table and "gsm8k " not in table


def test_bad_input_exits_non_zero_with_a_message(checkpoint, tmp_path, capsys):
    def cli(*argv) -> tuple[int, str]:
        code = main(["eval", *argv])
        return code, capsys.readouterr().err

    code, err = cli("synthetic", "--model", str(tmp_path / "nope"))
    assert code != 0 and "no model at" in err
    code, err = cli("gsm8k", "--model", str(checkpoint), "--data", str(tmp_path / "missing.jsonl"))
    assert code != 0 and "--data" in err and "does not exist" in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "no marker"}\n')
    code, err = cli("gsm8k", "--model", str(checkpoint), "--data", str(bad))
    assert code != 0 and "GSM8K's format" in err
    code, err = cli("all", "--model", str(checkpoint), "--data", str(bad))
    assert code != 0 and "single task" in err
    # the real command line, offline with nothing local: a clear message and a non-zero exit status
    p = subprocess.run([sys.executable, "-m", "portachat", "eval", "mmlu", "--model", str(checkpoint)],
                       capture_output=True, text=True, timeout=120,
                       env={"PORTACHAT_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin",
                            "OMP_NUM_THREADS": "1"})
    assert p.returncode != 0 and "Pass --data" in p.stderr
