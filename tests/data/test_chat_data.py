"""Conversation rows in the public formats, read from real jsonl/parquet files."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from portachat.data.chat_data import load_conversations, row_to_conversation
from portachat.data.document_source import DataError
from tests.conftest import require_shared


def test_gsm8k_calculator_annotations_become_tool_calls():
    conv = row_to_conversation({"question": "Q?", "answer": "Half is 48/2 = <<48/2=24>>24.\nSo <<48+24=72>>72.\n#### 72"})
    assert conv["answer"] == "72"
    user, assistant = conv["messages"]
    assert user == {"role": "user", "content": "Q?"}
    assert assistant["content"] == [
        {"type": "text", "text": "Half is 48/2 = "},
        {"type": "python", "text": "48/2"},
        {"type": "python_output", "text": "24"},
        {"type": "text", "text": "24.\nSo "},
        {"type": "python", "text": "48+24"},
        {"type": "python_output", "text": "72"},
        {"type": "text", "text": "72.\n#### 72"},
    ]


def test_real_gsm8k_file_loads_and_renders(small_tokenizer):
    from portachat.tokenizer import render_conversation

    path = require_shared("gsm8k/test.jsonl")
    convs = load_conversations([path], limit=50)
    assert len(convs) == 50 and all(c["answer"].lstrip("-").replace(".", "").isdigit() for c in convs)
    ids, mask = render_conversation(small_tokenizer, convs[0]["messages"])
    assert 0 < sum(mask) < len(ids)
    # Every tool call the annotations made is trained on; no tool output is.
    out_start = small_tokenizer.special_ids["<|output_start|>"]
    py_start = small_tokenizer.special_ids["<|python_start|>"]
    assert all(m == 0 for i, m in zip(ids, mask, strict=True) if i == out_start)
    assert any(m == 1 for i, m in zip(ids, mask, strict=True) if i == py_start)


def test_multiple_choice_rows_arc_and_mmlu():
    arc = row_to_conversation({"question": "Which is a gas?",
                               "choices": {"text": ["rock", "steam", "ice"], "label": ["A", "B", "C"]},
                               "answerKey": "B"})
    mmlu = row_to_conversation({"question": "2+2?", "choices": ["3", "4", "5", "6"], "answer": 1, "subject": "math"})
    assert arc["answer"] == "B" and arc["messages"][1]["content"] == "B"
    assert "A. rock\nB. steam\nC. ice" in arc["messages"][0]["content"]
    assert mmlu["answer"] == "B" and "D. 6" in mmlu["messages"][0]["content"]
    with pytest.raises(DataError, match="answerKey 'Z'"):
        row_to_conversation({"question": "q", "choices": {"text": ["a"], "label": ["A"]}, "answerKey": "Z"})


def test_messages_rows_from_jsonl_and_parquet_dirs(tmp_path):
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.jsonl").write_text(json.dumps({"messages": msgs}) + "\n\n", encoding="utf-8")
    pq.write_table(pa.table({"question": ["1+1?"], "answer": ["<<1+1=2>>2\n#### 2"]}), tmp_path / "d" / "b.parquet")
    convs = load_conversations([tmp_path / "d"])
    assert [c["messages"] for c in convs][0] == msgs
    assert convs[1]["answer"] == "2"


@pytest.mark.parametrize(
    ("content", "match"),
    [("{not json\n", "not valid JSON"), ('{"text": "just text"}\n', "not a conversation"),
     ('{"messages": [{"role": "assistant", "content": "hi"}]}\n', "message 0 .assistant.: expected role 'user'")],
)
def test_bad_rows_say_where(tmp_path, content, match):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=f"bad.jsonl:1: {match}"):
        load_conversations([bad])
    with pytest.raises(DataError, match="no such file"):
        load_conversations([tmp_path / "missing.jsonl"])


def test_hub_spec_offline_says_what_to_do(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match="pass --data FILE_OR_DIR"):
        load_conversations(["hf:nobody/not-a-dataset"])
    with pytest.raises(DataError, match="hf:OWNER/NAME"):
        load_conversations(["hf:justaname"])


def test_gzipped_jsonl(tmp_path):
    import gzip

    with gzip.open(tmp_path / "c.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(json.dumps({"question": "q", "choices": ["x", "y"], "answer": "B"}) + "\n")
    assert load_conversations([tmp_path])[0]["answer"] == "B"
