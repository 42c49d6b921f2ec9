"""The real command line speaks Chinese under a Chinese locale and English under LANG=C."""

from __future__ import annotations

import argparse
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from portachat.cli import build_parser, main
from portachat.device import reset_device_cache
from portachat.speedrun.doctor import run_doctor

ROOT = Path(__file__).resolve().parents[2]
LOCALE_VARS = ("PORTACHAT_LANG", "LANGUAGE", "LC_ALL", "LC_MESSAGES", "LANG")


def portachat(*args: str, lang: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in LOCALE_VARS and not k.startswith("PORTACHAT_")}
    env.update(LANG=lang, PORTACHAT_HOME=str(tmp_path), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "portachat", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_doctor_report_follows_portachat_lang(monkeypatch, tmp_path):
    for var in ("PORTACHAT_DEVICE", "PORTACHAT_DTYPE", "PORTACHAT_COMPILE", "WORLD_SIZE", "RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PORTACHAT_HOME", str(tmp_path))
    monkeypatch.setenv("PORTACHAT_DTYPE", "bf17")  # a failing check shows the verdict and its fix
    reset_device_cache()
    monkeypatch.setenv("PORTACHAT_LANG", "zh")
    out = io.StringIO()
    assert run_doctor(stream=out) == 1
    text = out.getvalue()
    assert "[失败] 配置: " in text and "修复：使用信息中列出的有效取值" in text and "结论：发现 1 个问题" in text
    assert "bf17" in text  # the value the user gave is quoted as it is
    assert "gloo（CPU 集合通信）" in text  # decisions say why in Chinese too


@pytest.mark.slow
def test_doctor_in_chinese_and_english(tmp_path):
    zh = portachat("doctor", lang="zh_CN.UTF-8", tmp_path=tmp_path)
    assert zh.returncode == 0, zh.stderr
    assert "结论：环境正常" in zh.stdout and "设备" in zh.stdout and "[正常] 配置" in zh.stdout
    en = portachat("doctor", lang="C", tmp_path=tmp_path)
    assert en.returncode == 0, en.stderr
    assert "Result: healthy" in en.stdout and "[ok  ] configuration" in en.stdout
    assert not any("\u4e00" <= ch <= "\u9fff" for ch in en.stdout)  # no Chinese at all


def test_train_base_help_in_chinese_and_english(tmp_path):
    zh = portachat("train", "base", "--help", lang="zh_CN.UTF-8", tmp_path=tmp_path)
    assert zh.returncode == 0, zh.stderr
    text = " ".join(zh.stdout.split())  # help is wrapped to the terminal width
    assert zh.stdout.startswith("用法：portachat train base") and "选项:" in zh.stdout
    assert "在原始文本上预训练 GPT" in text and "随机种子（默认 42）" in text and "文档：" in text
    assert "--device-batch-size" in text and "$PORTACHAT_HOME/runs" in text  # flags and paths stay
    en = portachat("train", "base", "--help", lang="C", tmp_path=tmp_path)
    text = " ".join(en.stdout.split())
    assert en.stdout.startswith("usage: portachat train base") and "options:" in en.stdout
    assert "Pretrain a GPT from raw text." in text and "random seed (default 42)" in text
    assert not any("\u4e00" <= ch <= "\u9fff" for ch in en.stdout)


def test_bad_flag_value_in_chinese(monkeypatch, capsys):
    monkeypatch.setenv("PORTACHAT_LANG", "zh")
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "base", "--total-batch-size", "0"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert "portachat train base: 错误：参数 --total-batch-size/--total_batch_size：必须至少为 1，实际为 0" in err
    monkeypatch.setenv("PORTACHAT_LANG", "en")
    with pytest.raises(SystemExit):
        main(["train", "base", "--total-batch-size", "zero"])
    assert "error: argument --total-batch-size/--total_batch_size: expected an integer, got 'zero'" in capsys.readouterr().err


def test_training_input_errors_in_chinese(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("PORTACHAT_LANG", "zh")
    monkeypatch.setenv("PORTACHAT_HOME", str(tmp_path))
    missing = tmp_path / "nope.txt"
    assert main(["train", "base", "--data", str(missing), "--device", "cpu", "--depth", "1"]) == 1
    err = capsys.readouterr().err
    assert f"portachat: 错误：{missing}：文件或目录不存在" in err and "'synthetic'" in err
    assert main(["train", "base", "--resume", "--overwrite", "--device", "cpu", "--depth", "1"]) == 1
    assert "--resume 会继续一次运行，--overwrite 会删除它" in capsys.readouterr().err


def test_speedrun_report_in_chinese(monkeypatch, tmp_path):
    from portachat.speedrun.pipeline import SYNTHETIC_NOTE
    from portachat.speedrun.report import render_report

    state = {
        "run": "r", "preset": "smoke", "data_note": SYNTHETIC_NOTE, "world_size": 2, "price_per_device_hour": 3.0,
        "stages": {"base": {"done": True, "seconds": 1800.0, "metrics": {"val_bpb": 1.25}},
                   "sft": {"done": False, "seconds": 60.0, "metrics": {}}},
        "evals": {"sft": {"synthetic": 0.75, "synthetic/comparison": 0.5}},
        "final_model": "/runs/r/sft/step_000005",
    }
    monkeypatch.setenv("PORTACHAT_LANG", "zh")
    text = render_report(state, {"device": "2 x test", "torch": "2.9"}, [], tmp_path)
    assert text.startswith("# portachat 速通：r") and "数据：内置合成课程数据（离线）" in text
    assert "## 各阶段" in text and "| 阶段 | 状态 | 用时 | 估算成本（美元） | 关键指标 |" in text
    assert "| base | 完成 | 30.0 分钟 | 3.0000 | val_bpb 1.2500 |" in text  # names and numbers stay
    assert "| sft | 未完成 | 60 秒 |" in text and "- 设备: 2 x test" in text and "- torch: 2.9" in text
    assert "portachat chat --model /runs/r/sft/step_000005" in text
    monkeypatch.setenv("PORTACHAT_LANG", "en")
    english = render_report(state, {"device": "2 x test"}, [], tmp_path)
    assert "| base | done | 30.0 min |" in english and "data: built-in synthetic curriculum (offline)." in english


def _parsers(parser: argparse.ArgumentParser, path: str = "portachat"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _parsers(child, f"{path} {name}")


def test_every_help_text_of_every_command_is_chinese(monkeypatch):
    monkeypatch.setenv("PORTACHAT_LANG", "zh")
    chinese = re.compile("[\u4e00-\u9fff]")
    english, checked = [], 0
    for path, parser in _parsers(build_parser()):
        subcommands = [c for a in parser._actions if isinstance(a, argparse._SubParsersAction) for c in a._choices_actions]
        for action in [*parser._actions, *subcommands]:
            text = action.help
            checked += bool(text)
            if text and text != argparse.SUPPRESS and not chinese.search(text):
                english.append(f"{path} {'/'.join(action.option_strings) or action.dest}: {text}")
        if parser.description and not chinese.search(parser.description):
            english.append(f"{path} (description): {parser.description}")
        assert parser.format_help().startswith("用法：")  # every %(default)s / %% in a translation formats
    assert checked > 200 and english == []


def test_memory_estimate_table_in_chinese_stays_aligned(monkeypatch):
    from portachat.i18n.width import display_width
    from portachat.model import GPTConfig
    from portachat.model.estimate import TrainingSetup, estimate_training, format_estimate

    monkeypatch.setenv("PORTACHAT_LANG", "zh")
    cfg = GPTConfig.from_depth(2, 1000, max_seq_len=64)
    text = format_estimate(estimate_training(cfg, TrainingSetup(2, 64, "bf16", "muon", False, 1, "ddp")))
    assert "组成部分（每个设备）" in text and "参数" in text and "峰值（" in text
    rows = [line for line in text.splitlines() if line.endswith(("MiB", "KiB", "GiB", " B"))]
    assert len(rows) >= 5 and len({display_width(line) for line in rows}) == 1  # one right edge


def test_terminal_chat_commands_in_chinese(monkeypatch):
    from portachat.engine.types import SamplingParams
    from portachat.serve.terminal_chat import ChatSession, handle_command

    monkeypatch.setenv("PORTACHAT_LANG", "zh")
    session, out = ChatSession(params=SamplingParams(temperature=0.5)), io.StringIO()
    assert handle_command("/temperature hot", session, out) and handle_command("/help", session, out)
    assert handle_command("/nope", session, out) and not handle_command("/quit", session, out)
    text = out.getvalue()
    assert "/temperature 需要一个 0 到 2 之间的数，例如 /temperature 0.7（当前为 0.5）" in text
    assert "命令：" in text and "/max-tokens N     最长回复的 token 数" in text and "未知命令 /nope" in text
