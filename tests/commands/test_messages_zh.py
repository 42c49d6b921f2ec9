"""The commands' own errors (not argparse's) speak the user's language and name flags as typed."""

from __future__ import annotations

import pytest

from portachat.cli import build_parser, main
from portachat.commands.run.inference import load_options


def test_docs_errors_follow_the_language(monkeypatch, tmp_path):
    store = str(tmp_path / "docs")
    monkeypatch.setenv("PORTACHAT_LANG", "zh")
    with pytest.raises(SystemExit) as exc:
        main(["docs", "list", "--collection", "notes", "--store-dir", store])
    assert str(exc.value.code) == ("portachat docs: 错误：没有名为 'notes' 的集合（现有集合：暂无）；"
                                   "请用 `portachat docs add FILE --collection NAME` 创建")
    with pytest.raises(SystemExit) as exc:
        main(["docs", "add", str(tmp_path / "missing.md"), "--collection", "notes", "--store-dir", store])
    assert str(exc.value.code) == f"portachat docs: 错误：{tmp_path / 'missing.md'}：没有这个文件或目录"
    monkeypatch.setenv("PORTACHAT_LANG", "en")
    with pytest.raises(SystemExit) as exc:
        main(["docs", "list", "--collection", "notes", "--store-dir", store])
    assert str(exc.value.code).startswith("portachat docs: error: no collection 'notes' (collections: none yet)")


def test_serve_flag_values_in_chinese(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("PORTACHAT_LANG", "zh")
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--model", "m", "--gpu-memory-utilization", "2"])
    assert exc.value.code == 2
    assert "必须在 (0, 1] 范围内，实际为 2.0" in capsys.readouterr().err
    empty = tmp_path / "template.jinja"
    empty.write_text("  \n", encoding="utf-8")
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--model", "m", "--chat-template", str(empty)])
    assert exc.value.code == 2
    assert f"{empty} 为空：请给出一个 Jinja 聊天模板文件" in capsys.readouterr().err


def test_speculative_tuning_without_a_speculative_model_names_the_flags_given(monkeypatch):
    parse = build_parser().parse_args
    args = parse(["chat", "--model", "m", "--ngram-prompt-lookup-max", "3", "--speculative-draft-vocab", "100"])
    with pytest.raises(ValueError) as exc:
        load_options(args)
    assert str(exc.value) == ("--ngram-prompt-lookup-max, --speculative-draft-vocab need --speculative-model "
                              "(ngram or a draft model path)")
    monkeypatch.setenv("PORTACHAT_LANG", "zh")
    with pytest.raises(ValueError) as exc:
        load_options(args)
    assert str(exc.value) == ("--ngram-prompt-lookup-max, --speculative-draft-vocab 需要配合 --speculative-model"
                              "（ngram 或草稿模型路径）使用")
