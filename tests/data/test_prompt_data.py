"""Prompt files for GRPO: TRL's plain and conversational prompts, chat rows and GSM8K rows, with the
other columns kept for the rewards, and errors naming the file and line."""

from __future__ import annotations

import json

import pytest

from portachat.data.document_source import DataError
from portachat.data.prompt_data import load_prompts


def write(path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_formats_and_columns(tmp_path):
    user = {"role": "user", "content": "2+2?"}
    data = write(tmp_path / "p.jsonl", [
        {"prompt": "Once upon a time", "topic": "story"},
        {"prompt": [user], "answer": "4"},
        {"messages": [user, {"role": "assistant", "content": "4"}], "answer": "4"},
        {"question": "What is 3+3?", "answer": "6 #### 6"},
    ])
    rows = load_prompts([data])
    assert [r.conversational for r in rows] == [False, True, True, True]
    assert rows[0].prompt == "Once upon a time" and rows[0].columns == {"topic": "story"}
    assert rows[1].prompt == [user] and rows[1].columns == {"answer": "4"}
    assert rows[2].prompt == [user]  # the reference reply is dropped: the model writes its own
    assert rows[3].prompt == [{"role": "user", "content": "What is 3+3?"}]
    assert rows[3].columns == {"answer": "6 #### 6"}
    assert len(load_prompts([data], limit=2)) == 2


def test_bad_rows_name_file_and_line(tmp_path):
    data = write(tmp_path / "bad.jsonl", [{"prompt": "ok"}, {"text": "no prompt here"}])
    with pytest.raises(DataError, match=r"bad\.jsonl:2: not a prompt.*got keys \['text'\]"):
        load_prompts([data])
    data = write(tmp_path / "bad2.jsonl", [{"prompt": "ok"}, "{not json"])
    with pytest.raises(DataError, match=r"bad2\.jsonl:2: not valid JSON"):
        load_prompts([data])
    data = write(tmp_path / "bad3.jsonl", [{"messages": [{"role": "user"}]}])
    with pytest.raises(DataError, match=r"bad3\.jsonl:1: message 0"):
        load_prompts([data])
