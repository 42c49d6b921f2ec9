"""`train prefs`: right replies against wrong ones, per prompt, from checked samples; questions from the
synthetic tasks or GSM8K-style files; the file round-trips through the DPO loader; the engine path runs."""

from __future__ import annotations

import json

import pytest

from portachat.data.preference_data import load_pairs
from portachat.train.self_prefs import PrefsOptions, Question, make_pairs, questions, run_prefs, write_pairs
from portachat.train.trainer import TrainingError
from tests.model.hf_families import make_hf_dir


def q(answer: str) -> Question:
    return Question([{"role": "user", "content": f"what gives {answer}?"}], answer, lambda reply: answer in reply)


def test_pairs_put_a_right_reply_against_a_wrong_one():
    items = [q("7"), q("8"), q("9")]
    replies = [["it is 7", "it is 3", "it is 7", "no idea"],  # right and wrong: pairs
               ["8", "8!"],  # always right: nothing to prefer
               ["1", "2"]]  # never right
    pairs, verdicts = make_pairs(items, replies, pairs_per_prompt=2)
    assert verdicts == [[True, False, True, False], [True, True], [False, False]]
    assert [(p.chosen[0]["content"], p.rejected[0]["content"]) for p in pairs] == [("it is 7", "it is 3")]
    assert pairs[0].prompt == items[0].prompt and pairs[0].answer == "7"  # duplicates count once
    pairs, _v = make_pairs([q("7")], [["7a", "7b", "x", "y"]], pairs_per_prompt=2)
    assert [(p.chosen[0]["content"], p.rejected[0]["content"]) for p in pairs] == [("7a", "x"), ("7b", "y")]


def test_written_pairs_read_back_through_the_dpo_loader(tmp_path):
    pairs, _v = make_pairs([q("7"), q("5")], [["7", "1"], ["5", "6"]])
    path = tmp_path / "out" / "prefs.jsonl"
    write_pairs(path, pairs)
    back = load_pairs([path])
    assert [(p.prompt, p.chosen, p.rejected, p.answer) for p in back] == \
        [(p.prompt, p.chosen, p.rejected, p.answer) for p in pairs]
    assert not [f for f in path.parent.iterdir() if f.name.startswith(".tmp")]  # written atomically


def test_questions_come_from_gsm8k_rows_or_the_synthetic_tasks(tmp_path):
    data = tmp_path / "gsm8k.jsonl"
    data.write_text(json.dumps({"question": "Tom has 2 apples and buys 3. How many?",
                                "answer": "2+3 = <<2+3=5>>5\n#### 5"}) + "\n", encoding="utf-8")
    [item] = questions(PrefsOptions(model="m", output="o", data=[str(data)]))
    assert item.answer == "5" and item.prompt[-1]["role"] == "user"
    assert item.check("so the answer is 5") and not item.check("the answer is 6")
    synthetic = questions(PrefsOptions(model="m", output="o", tasks=["mental_arithmetic"], num_prompts=5))
    assert len(synthetic) == 5 and all(s.prompt[-1]["role"] == "user" for s in synthetic)
    with pytest.raises(TrainingError, match="--tasks"):
        questions(PrefsOptions(model="m", output="o", tasks=["no_such_task"]))


def test_a_model_that_never_answers_right_gives_no_pairs_and_no_file(tmp_path):
    base = tmp_path / "base"
    make_hf_dir(base, "llama", seed=1)  # random weights: replies are noise
    out = tmp_path / "prefs.jsonl"
    opts = PrefsOptions(model=str(base), output=str(out), tasks=["mental_arithmetic"], num_prompts=3, num_samples=2,
                        max_new_tokens=4, device="cpu", dtype="fp32")
    with pytest.raises(TrainingError, match="no pairs"):
        run_prefs(opts, print_fn=lambda _m: None)
    assert not out.exists()
