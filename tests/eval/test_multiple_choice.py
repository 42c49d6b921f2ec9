from __future__ import annotations

import csv
import json

import pytest
import torch

from portachat.eval.data_files import EvalDataError
from portachat.eval.generation import as_chat_tokenizer
from portachat.eval.multiple_choice import (
    LETTERS,
    evaluate_multiple_choice,
    letter_ids,
    read_arc,
    read_mmlu,
    render_question,
)

ARC_HF = [
    {"id": "q1", "question": "Which gas do plants take in?", "answerKey": "B",
     "choices": {"text": ["oxygen", "carbon dioxide", "helium", "neon"], "label": ["A", "B", "C", "D"]}},
    {"id": "q2", "question": "What melts ice?", "answerKey": "3",
     "choices": {"text": ["cold", "dark", "heat"], "label": ["1", "2", "3"]}},
]
ARC_AI2 = {"id": "q3", "answerKey": "A", "question": {"stem": "Water boils at?", "choices": [
    {"text": "100 C", "label": "A"}, {"text": "10 C", "label": "B"}]}}
MMLU_HF = [
    {"question": "2+2=?", "subject": "math", "choices": ["3", "4", "5", "6"], "answer": 1},
    {"question": "Capital of France?", "subject": "geo", "choices": ["Paris", "Rome", "Oslo", "Lima"], "answer": 0},
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_arc_reader_takes_both_public_layouts(tmp_path):
    qs = read_arc(write_jsonl(tmp_path / "arc.jsonl", [*ARC_HF, ARC_AI2]))
    assert [q.answer for q in qs] == [1, 2, 0]
    assert qs[1].choices == ("cold", "dark", "heat") and qs[2].question == "Water boils at?"
    assert len(read_arc(tmp_path / "arc.jsonl", limit=2)) == 2


def test_mmlu_reader_takes_jsonl_parquet_and_csv(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    qs = read_mmlu(write_jsonl(tmp_path / "mmlu.jsonl", MMLU_HF))
    assert [(q.answer, q.subject) for q in qs] == [(1, "math"), (0, "geo")]
    pq.write_table(pa.Table.from_pylist(MMLU_HF), tmp_path / "mmlu.parquet")
    assert read_mmlu(tmp_path / "mmlu.parquet") == qs
    d = tmp_path / "csvs"
    d.mkdir()
    with open(d / "astronomy_test.csv", "w", newline="") as f:
        csv.writer(f).writerow(["Closest star?", "Sun", "Vega", "Sirius", "Rigel", "A"])
    (q,) = read_mmlu(d)
    assert q.subject == "astronomy" and q.answer == 0 and q.choices[0] == "Sun"


def test_bad_rows_and_missing_files_say_what_is_wrong(tmp_path):
    with pytest.raises(EvalDataError, match="answerKey 'E'"):
        read_arc(write_jsonl(tmp_path / "a.jsonl", [{**ARC_HF[0], "answerKey": "E"}]))
    with pytest.raises(EvalDataError, match="not an MMLU row"):
        read_mmlu(write_jsonl(tmp_path / "m.jsonl", [{"question": "x", "choices": ["a"], "answer": 3}]))
    with pytest.raises(EvalDataError, match="not valid JSON"):
        (tmp_path / "bad.jsonl").write_text("{nope\n")
        read_arc(tmp_path / "bad.jsonl")
    with pytest.raises(EvalDataError, match="--data"):
        read_arc(tmp_path / "missing.jsonl")


def test_letter_logit_scoring_matches_an_unbatched_reference(tool_model, small_tokenizer, tmp_path):
    model, _ = tool_model
    tok = as_chat_tokenizer(small_tokenizer)
    questions = read_arc(write_jsonl(tmp_path / "arc.jsonl", [*ARC_HF, ARC_AI2] * 3))
    result = evaluate_multiple_choice("arc", model, tok, questions, batch_size=4)
    letters = letter_ids(tok, len(LETTERS))
    right = 0
    with torch.no_grad():
        for q in questions:
            logits = model(torch.tensor([tok.render_prompt(render_question(q))]))[0, -1]
            right += int(logits[letters[:len(q.choices)]].argmax()) == q.answer
    assert result.value == pytest.approx(right / len(questions))
    assert result.n == 9 and result.chance == pytest.approx((0.25 + 1 / 3 + 0.5) / 3)
    assert "Respond only with the letter" in render_question(questions[0])[0]["content"]
