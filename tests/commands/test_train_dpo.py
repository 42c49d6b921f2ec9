"""`train dpo` and `train prefs` on the command line: sft's fine-tuning flags plus the preference ones, and
their help in English and Chinese."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from portachat.cli import build_parser


def test_train_dpo_takes_sfts_flags_and_the_preference_ones():
    args = build_parser().parse_args(["train", "dpo", "--init", "m.gguf", "--data", "p.jsonl", "--loss", "ipo",
                                      "--beta", "0.2", "--lora-rank", "8", "--merge", "--lr", "1e-5",
                                      "--num-iterations", "3", "--reference", "cache", "--fsdp", "on"])
    assert (args.loss, args.beta, args.lora_rank, args.merge, args.lr, args.num_iterations) == \
        ("ipo", 0.2, 8, True, 1e-5, 3)
    assert args.reference == "cache" and args.fsdp == "on" and args.data == ["p.jsonl"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "dpo", "--init", "m", "--loss", "kto"])
    args = build_parser().parse_args(["train", "prefs", "--model", "m", "--output", "o.jsonl", "--num-samples", "8"])
    assert args.num_samples == 8 and args.tasks is None


@pytest.mark.parametrize("lang,expected", [("en", "Align a model on preference pairs"), ("zh", "在偏好对上对齐模型")])
def test_help_speaks_both_languages(lang, expected):
    env = {k: v for k, v in os.environ.items() if k not in ("LANGUAGE", "LC_ALL", "LC_MESSAGES", "LANG")}
    env.update(PORTACHAT_LANG=lang, LANG="C")
    proc = subprocess.run([sys.executable, "-m", "portachat", "train", "dpo", "--help"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert expected.replace(" ", "") in "".join(proc.stdout.split()), proc.stdout[:800]  # help wraps lines
