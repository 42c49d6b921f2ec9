from __future__ import annotations

import pytest

from portachat.engine.calculator import calculate
from portachat.eval.generation import as_chat_tokenizer, model_complete
from portachat.eval.gsm8k import conversation, evaluate_gsm8k, is_correct, predicted_answer, read_gsm8k
from portachat.tokenizer.chat import render_conversation


def test_answer_extraction():
    assert predicted_answer("She makes 9 * 2 = 18 dollars.\n#### 18") == "18"
    assert predicted_answer("#### 1,234.50") == "1234.5"
    assert predicted_answer("so the total is $42.") == "42"
    assert predicted_answer("<|python_start|>6*7<|python_end|><|output_start|>42<|output_end|>The answer is 41.") == "41"
    assert predicted_answer("no idea") is None
    assert is_correct("#### 72", "72") and is_correct("The answer is 72.0.", "72") and not is_correct("#### 7", "72")


def test_reads_a_slice_and_tool_calls_agree_with_the_calculator(gsm8k_test_path, small_tokenizer):
    problems = read_gsm8k(gsm8k_test_path, limit=20)
    assert len(problems) == 20 and problems[0].answer == "18"
    checked = 0
    for p in problems:
        messages = conversation(p)
        ids, mask = render_conversation(small_tokenizer, messages)
        assert sum(mask) > 0
        parts = messages[1]["content"]
        assert parts[-1]["text"].rstrip().endswith(f"#### {p.solution.rsplit('####', 1)[1].strip()}")
        for call, out in zip(parts, parts[1:], strict=False):
            if call["type"] == "python":
                result = calculate(call["text"])
                if result is not None:
                    assert float(result) == pytest.approx(float(out["text"]), rel=1e-3)
                    checked += 1
    assert checked > 20


def test_end_to_end_on_a_slice(gsm8k_test_path, tool_model, small_tokenizer):
    problems = read_gsm8k(gsm8k_test_path, limit=4)
    oracle = {p.question: p.solution for p in problems}
    right = evaluate_gsm8k(lambda convs, n, t: [oracle[c[0]["content"]] for c in convs], problems)
    assert right.value == 1.0 and right.n == 4
    wrong = evaluate_gsm8k(lambda convs, n, t: ["#### -1"] * len(convs), problems)
    assert wrong.value == 0.0
    model, _ = tool_model
    real = evaluate_gsm8k(model_complete(model, as_chat_tokenizer(small_tokenizer)), problems[:2], max_tokens=16)
    assert real.n == 2 and 0.0 <= real.value <= 1.0 and len(real.details["samples"]) == 2
