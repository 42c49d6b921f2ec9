"""`compress`: prune -> heal -> evaluate -> report. The heal step gets the pruned student and its
teacher through the HealStep interface; the report holds before/pruned/healed numbers and a plot."""

from __future__ import annotations

import json
import math

import pytest
import torch

from portachat.cli import main
from portachat.compress.prune import PruneError, PruneTargets
from portachat.compress.prune_run import PruneOptions
from portachat.compress.recipe import CompressOptions, HealRequest, run_compress
from portachat.device import get_device
from tests.model.hf_families import make_hf_dir, train_bpe

transformers = pytest.importorskip("transformers")


@pytest.fixture
def chats(tmp_path):
    """Short conversations in the tiny tokenizer's words, so rows hold whole replies."""
    path = tmp_path / "chats.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"the quick brown fox {i}"},
                          {"role": "assistant", "content": "jumps over a lazy dog while seven wizards hex gnomes"}]}
            for i in range(120)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _opts(source, output, data, **kwargs) -> CompressOptions:
    prune = PruneOptions(model=str(source), output="", targets=PruneTargets(num_layers=2, ffn_hidden_size=64),
                         data=str(data), calibration_samples=4, seq_len=48, depth_metric="cosine")
    return CompressOptions(prune=prune, output=str(output), eval_samples=4, decode_tokens=4, **kwargs)


def test_compress_hands_the_student_and_teacher_to_the_heal_step_and_reports(tmp_path, chats):
    make_hf_dir(tmp_path / "src", "llama", tokenizer=train_bpe(), num_hidden_layers=3)
    seen: list[HealRequest] = []

    def heal(req, dev, print_fn):  # a heal step that trains nothing: the student comes back as it is
        seen.append(req)
        return req.student

    result = run_compress(_opts(tmp_path / "src", tmp_path / "out", chats, heal_steps=7), dev=get_device("cpu"),
                          heal=heal, print_fn=lambda _m: None)
    (req,) = seen
    assert req.student == tmp_path / "out" / "pruned" and req.teacher == str(tmp_path / "src")
    assert (req.data, req.steps, req.runs_root) == (str(chats), 7, tmp_path / "out" / "runs")
    report = json.loads((tmp_path / "out" / "report.json").read_text())["columns"]
    assert list(report) == ["before", "pruned", "healed"]
    assert report["before"]["params"] > report["pruned"]["params"] == report["healed"]["params"]
    assert report["pruned"]["perplexity"] == report["healed"]["perplexity"]  # the same weights
    assert report["before"]["layers"] == 3 and report["pruned"]["layers"] == 2
    assert all(math.isfinite(c["perplexity"]) and c["decode_tok_s"] > 0 for c in report.values())
    assert (tmp_path / "out" / "compress.png").stat().st_size > 0
    text = result.report.read_text()
    assert "| parameters" in text and "compress.png" in text


def test_compress_refuses_text_data_without_heal_data_before_any_work(tmp_path, shakespeare_path):
    with pytest.raises(PruneError, match="--heal-data"):
        run_compress(_opts(tmp_path / "missing-model", tmp_path / "out", shakespeare_path), dev=get_device("cpu"))
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_compress_command_heals_by_fine_tuning(tmp_path, chats, capsys):
    make_hf_dir(tmp_path / "src", "qwen2", tokenizer=train_bpe(), num_hidden_layers=3)
    code = main(["compress", "--model", str(tmp_path / "src"), "--output", str(tmp_path / "out"), "--data", str(chats),
                 "--target-num-layers", "2", "--calibration-samples", "4", "--seq-len", "48", "--heal-steps", "4",
                 "--device-batch-size", "2", "--eval-samples", "4", "--decode-tokens", "4", "--device", "cpu"])
    assert code == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())["columns"]
    assert report["healed"]["perplexity"] < report["pruned"]["perplexity"]  # healing helped
    healed = sorted((tmp_path / "out" / "runs" / "compress" / "sft").glob("step_*"))[-1]
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(healed), dtype=torch.float32)
    assert hf.config.num_hidden_layers == 2
