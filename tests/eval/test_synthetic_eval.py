from __future__ import annotations

import json

import pytest

from portachat.data.synthetic.tasks import heldout_set
from portachat.eval.core import centered, core_score
from portachat.eval.generation import as_chat_tokenizer, model_complete
from portachat.eval.report import EvalResult, format_table, summary, to_json
from portachat.eval.synthetic import evaluate_synthetic


def reference_reply(ex) -> str:
    out = []
    for part in ex.assistant:
        if part["type"] == "python":
            out.append(f"<|python_start|>{part['text']}<|python_end|>")
        elif part["type"] == "python_output":
            out.append(f"<|output_start|>{part['text']}<|output_end|>")
        else:
            out.append(part["text"])
    return "".join(out)


def test_oracle_scores_one_and_a_half_right_model_half():
    by_question = {ex.question: ex for ex in heldout_set(40, seed=0)}
    flip = {}

    def oracle(convs, max_tokens, temperature):
        return [reference_reply(by_question[c[0]["content"]]) for c in convs]

    def half(convs, max_tokens, temperature):
        out = []
        for c in convs:
            q = c[0]["content"]
            flip[q] = len(flip) % 2 == 0
            out.append(reference_reply(by_question[q]) if flip[q] else "The answer is nothing.")
        return out

    assert evaluate_synthetic(oracle, n=40, batch_size=16).value == 1.0
    result = evaluate_synthetic(half, n=40, batch_size=16)
    assert result.value == pytest.approx(0.5)
    assert set(result.details["per_task"]) <= {"calc_arithmetic", "mental_arithmetic", "letter_count",
                                               "comparison", "spelling"}
    assert result.n == 40 and result.chance == 0.0


def test_accuracy_is_reported_per_language():
    """A model that answers only the Chinese questions right scores 1 on zh and 0 on en, per task too."""
    by_question = {ex.question: ex for ex in heldout_set(60, seed=0)}
    langs = {ex.lang for ex in by_question.values()}
    assert langs == {"en", "zh"}

    def chinese_only(convs, max_tokens, temperature):
        return [reference_reply(ex) if (ex := by_question[c[0]["content"]]).lang == "zh" else
                "The answer is nothing." for c in convs]

    result = evaluate_synthetic(chinese_only, n=60, batch_size=32)
    per_lang = result.details["per_lang"]
    assert per_lang["zh"] == 1.0 and per_lang["en"] == 0.0
    n_zh = sum(ex.lang == "zh" for ex in by_question.values())
    assert result.value == pytest.approx(n_zh / 60)
    tasks = {ex.task for ex in by_question.values() if ex.lang == "zh"}
    assert {f"zh/{t}" for t in tasks} <= set(per_lang) and all(per_lang[f"zh/{t}"] == 1.0 for t in tasks)
    assert all(v == 0.0 for k, v in per_lang.items() if k.startswith("en"))
    table = format_table([result])
    assert "  zh " in table and "  en/" in table and "  zh/calc_arithmetic" in table


def test_real_model_runs_end_to_end(tool_model, small_tokenizer):
    model, _ = tool_model
    result = evaluate_synthetic(model_complete(model, as_chat_tokenizer(small_tokenizer)), n=4,
                                tasks=["calc_arithmetic"], max_tokens=24)
    assert result.n == 4 and 0.0 <= result.value <= 1.0
    # it learned the tool-call form: the replies call the calculator
    assert all("<|python_start|>" in s["reply"] for s in result.details["samples"])


def test_core_centres_on_chance_and_report_formats():
    assert centered(0.25, 0.25) == 0.0 and centered(1.0, 0.25) == 1.0 and centered(0.5, 0.0) == 0.5
    results = [EvalResult("arc", "accuracy", 0.625, 8, 0.25), EvalResult("gsm8k", "accuracy", 0.1, 10, 0.0),
               EvalResult("bpb", "bits_per_byte", 1.2, 1000)]
    core = core_score(results)
    assert core.value == pytest.approx((0.5 + 0.1) / 2) and core.n == 2
    table = format_table([*results, core])
    assert "arc" in table and "0.6250" in table and "centered_mean" in table
    assert json.loads(to_json(results))["results"][0]["task"] == "arc"
    assert summary(results)["gsm8k"] == 0.1
    with pytest.raises(ValueError, match="no task results"):
        core_score([results[2]])
