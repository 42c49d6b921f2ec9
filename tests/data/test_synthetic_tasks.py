from __future__ import annotations

import re
from collections import Counter

import pytest

from portachat.data.synthetic import documents as sd
from portachat.data.synthetic import heldout
from portachat.data.synthetic import tasks as st
from portachat.tokenizer.chat import render_conversation


def solve(question: str) -> str:
    """An independent solver for every question form the task curriculum asks."""
    if m := re.fullmatch(r"(?:What is|Calculate) (\d+) ?([+\-*]) ?(\d+)[?.]", question):
        a, op, b = int(m[1]), m[2], int(m[3])
        return str({"+": a + b, "-": a - b, "*": a * b}[op])
    if m := re.fullmatch(r"What is (\d+) (plus|minus|times) (\d+)\?", question):
        a, b = int(m[1]), int(m[3])
        return str({"plus": a + b, "minus": a - b, "times": a * b}[m[2]])
    if m := re.search(r"(\d+) \+ (\d+)|Add (\d+) and (\d+)", question):
        nums = [int(x) for x in m.groups() if x is not None]
        return str(sum(nums))
    if m := re.fullmatch(r"How many times does the letter (\w) appear in (\w+)\?|How many (\w)'s are in (\w+)\?"
                         r"|Count the letter (\w) in (\w+)\.", question):
        letter, word = [x for x in m.groups() if x is not None]
        return str(word.count(letter))
    if m := re.fullmatch(r"Which (?:number )?is (larger|smaller)[,:] (\d+) or (\d+)\?", question):
        pick = max if m[1] == "larger" else min
        return str(pick(int(m[2]), int(m[3])))
    if m := re.fullmatch(r"Is (\d+) (less|greater) than (\d+)\?", question):
        a, b = int(m[1]), int(m[3])
        return "yes" if (a < b if m[2] == "less" else a > b) else "no"
    if m := re.fullmatch(r"Is (\d+) larger or smaller than (\d+)\?", question):
        return "smaller" if int(m[1]) < int(m[2]) else "larger"
    if m := re.fullmatch(r"(?:How do you spell|Spell the word|Spell) (\w+)[?.]", question):
        return "-".join(m[1])
    return solve_zh(question)


ZH_OPS = {"加": "+", "减": "-", "乘以": "*", "+": "+", "-": "-", "*": "*"}


def solve_zh(question: str) -> str:
    """An independent solver for the Chinese phrasings."""
    if m := re.fullmatch(r"(?:计算|心算|不用计算器，)?(\d+) ?(加|减|乘以|[+\-*]) ?(\d+)(?:等于多少？(?:请心算。)?|。)", question):
        a, b = int(m[1]), int(m[3])
        return str({"+": a + b, "-": a - b, "*": a * b}[ZH_OPS[m[2]]])
    if m := re.fullmatch(r"(?:单词|数一数)?([a-z]+)(?:里有几个|中字母|里的字母)([a-z])(?:？|出现了几次？|。)", question):
        return str(m[1].count(m[2]))
    if m := re.fullmatch(r"“(.+)”(?:里有几个|中)“(.)”字(?:？|出现了几次？)", question):
        return str(m[1].count(m[2]))
    if m := re.fullmatch(r"(\d+)和(\d+)，?哪个(?:数更)?([大小])？", question):
        pick = max if m[3] == "大" else min
        return str(pick(int(m[1]), int(m[2])))
    if m := re.fullmatch(r"(\d+)比(\d+)([大小])吗？", question):
        a, b = int(m[1]), int(m[2])
        return "是" if (a > b if m[3] == "大" else a < b) else "否"
    if m := re.fullmatch(r"(\d+)比(\d+)大还是小？", question):
        return "小" if int(m[1]) < int(m[2]) else "大"
    if m := re.fullmatch(r"(?:拼写单词)?([a-z]+)(?:怎么拼写？|这个词怎么拼？|。)", question):
        return "-".join(m[1])
    raise AssertionError(f"unknown question form: {question!r}")


def reply_text(ex: st.TaskExample) -> str:
    """The reference reply as a model's decoded output reads (tool tokens as literal strings)."""
    out = []
    for part in ex.assistant:
        if part["type"] == "python":
            out.append(f"<|python_start|>{part['text']}<|python_end|>")
        elif part["type"] == "python_output":
            out.append(f"<|output_start|>{part['text']}<|output_end|>")
        else:
            out.append(part["text"])
    return "".join(out) + "<|assistant_end|>"


def run_tool(expr: str) -> str:
    """An independent evaluator of the two tool-call forms the curriculum writes."""
    if m := re.fullmatch(r"'(\w+)'\.count\('(\w)'\)", expr):
        return str(m[1].count(m[2]))
    assert re.fullmatch(r"\d+[+\-*]\d+", expr), expr
    return str(eval(expr, {"__builtins__": {}}))  # digits and one operator only (checked above)


def test_every_answer_is_correct_and_every_reference_reply_verifies():
    examples = st.task_examples(600, "train", seed=1) + st.task_examples(300, "heldout", seed=1)
    assert set(Counter(ex.task for ex in examples)) == set(st.TASKS)
    assert set(Counter((ex.task, ex.lang) for ex in examples)) == {(t, lang) for t in st.TASKS for lang in st.LANGS}
    for ex in examples:
        assert solve(ex.question) == ex.answer, ex
        assert ex.verify(reply_text(ex)), ex
        assert ex.reward(reply_text(ex)) == 1.0
        for i, part in enumerate(ex.assistant):
            if part["type"] == "python":
                assert ex.assistant[i + 1] == {"type": "python_output", "text": run_tool(part["text"])}


def test_comparison_replies_work_digit_by_digit():
    """Every step of a worked comparison is true, in both languages: the tens compared first, the ones
    exactly when the tens tie, the relation in the question's order, and the answer's place named
    before the answer."""
    examples = [ex for ex in st.task_examples(3000, "train", seed=11) if ex.task == "comparison"]
    ties = 0
    for ex in examples:
        a, b = (int(x) for x in re.findall(r"\d+", ex.question))
        text = ex.assistant[-1]["text"]
        zh = ex.lang == "zh"
        if zh:
            compared = re.findall(r"(十位|个位)(\d)和(\d)：(\d) ([<>=]) (\d)", text)
            names = ("十位", "个位")
        else:
            compared = re.findall(r"(Tens|Ones) (\d) and (\d): (\d) ([<>=]) (\d)", text)
            names = ("Tens", "Ones")
        expected = [(names[0], a // 10, b // 10)] + ([(names[1], a % 10, b % 10)] if a // 10 == b // 10 else [])
        assert [(c[0], int(c[1]), int(c[2])) for c in compared] == expected, text
        for _, x, y, x2, sym, y2 in compared:
            assert (x, y) == (x2, y2) and sym == ("<" if x < y else ">" if x > y else "=")
        ties += len(compared) == 2
        rel = "<" if a < b else ">"
        if zh:
            m = re.search(r"所以(\d+) ([<>]) (\d+)。(?:较([大小])的是第([一二])个，(\d+)。|([大小])吗？([是否])。)?"
                          r"答案：(.+)。$", text)
        else:
            m = re.search(r"so (\d+) ([<>]) (\d+)\. (?:The (larger|smaller) is the (first|second), (\d+)\. |"
                          r"(Less|Greater)\? (Yes|No)\. )?The answer is (\w+)\.$", text)
        assert m and (int(m[1]), m[2], int(m[3])) == (a, rel, b), text
        assert m[9] == solve(ex.question)
        if m[4]:  # the answer's place in the question is named before the answer is copied from it
            assert m[4] in ex.question and m[6] == m[9] == str((a, b)[m[5] in ("second", "二")]), text
        elif m[7]:  # the word asked about is repeated next to the relation, then answered
            assert m[7].lower() in ex.question and m[8].lower() == m[9], text
        else:  # "larger or smaller?" is answered from the relation just written
            assert ("大还是小" if zh else "larger or smaller") in ex.question, text
    assert len(examples) > 400 and ties > 10  # both branches are exercised
    assert {ex.lang for ex in examples} == {"en", "zh"}


def test_verifier_rejects_wrong_missing_and_tool_only_answers():
    ex = next(e for e in st.task_examples(50, seed=2) if e.task == "calc_arithmetic")
    wrong = str(int(ex.answer) + 1)
    assert not ex.verify(f"The answer is {wrong}.")
    assert not ex.verify(ex.answer)  # no final form
    assert not ex.verify("")
    # the right number inside the tool output but a wrong final answer is wrong
    assert not ex.verify(f"<|python_start|>1+1<|python_end|><|output_start|>{ex.answer}<|output_end|>"
                         f"The answer is {wrong}.")
    assert ex.verify(f"the answer is {ex.answer}")  # case and the final period do not matter
    assert ex.reward("nonsense") == 0.0
    assert st.extract_answer("x. The answer is a-p-p-l-e.") == "a-p-p-l-e"
    assert st.normalize_answer("1,234") == "1234"


def test_splits_are_disjoint_and_deterministic():
    train = st.task_examples(3000, "train", seed=0)
    held = st.heldout_set(300, seed=0)
    assert len({ex.key for ex in held}) == len(held) == 300
    assert all(ex.split == "train" for ex in train) and all(ex.split == "heldout" for ex in held)
    assert not {ex.key for ex in train} & {ex.key for ex in held}
    assert not {ex.question for ex in train} & {ex.question for ex in held}
    assert st.task_examples(50, "train", seed=0) == train[:50]
    assert st.task_examples(50, "train", seed=5) != train[:50]
    assert st.heldout_set(300, seed=0) == held
    # roughly 10% of keys are held out
    frac = sum(heldout.split_of(f"calc:{i}+{i + 1}") == "heldout" for i in range(5000)) / 5000
    assert 0.07 < frac < 0.13


def test_weights_and_task_selection():
    only = st.task_examples(200, seed=3, tasks=["comparison", "spelling"])
    assert {ex.task for ex in only} == {"comparison", "spelling"}
    counts = Counter(ex.task for ex in st.task_examples(4000, seed=3))
    assert counts["calc_arithmetic"] > counts["spelling"] * 2
    with pytest.raises(ValueError, match="unknown synthetic task"):
        st.task_examples(1, tasks=["nope"])
    with pytest.raises(ValueError, match="split"):
        st.task_examples(1, split="val")


def test_conversations_render_short_with_tool_output_masked(small_tokenizer):
    convs = st.conversations(100, seed=4)
    lengths = []
    for conv in convs:
        ids, mask = render_conversation(small_tokenizer, conv)
        lengths.append(len(ids))
        assert sum(mask) > 0
        out_start = small_tokenizer.special_ids["<|output_start|>"]
        if out_start in ids:
            assert mask[ids.index(out_start)] == 0
    assert max(lengths) < 160  # short enough for a tiny model's context and a quick SFT


def test_documents_use_only_train_questions():
    docs = sd.task_documents(200, seed=0)
    assert len(docs) == 200 and all(docs)
    held_questions = {ex.question for ex in st.heldout_set(400, seed=0)}
    text = "\n".join(docs)
    assert "The answer is" in text and " = " in text
    paragraphs = [p.split("\n")[0] for d in docs for p in d.split("\n\n")]
    assert not held_questions & set(paragraphs)
    assert sd.task_documents(5, seed=0) == docs[:5]


def test_question_key_recovers_the_key_from_any_phrasing():
    for ex in st.task_examples(1500, "train", seed=7) + st.task_examples(300, "heldout", seed=7):
        assert heldout.question_key(ex.question) == ex.key, ex
    assert heldout.question_key("What is the capital of France?") is None
    # the base curriculum (synthetic.py) asks some of the same questions: they map to the same keys
    assert heldout.question_key("Which is larger, 47 or 52?") == "compare:larger:47:52"
    assert heldout.question_key("What is 23 + 58?") == "calc:23+58"


def test_task_document_source_units():
    train, val = sd.TaskDocumentSource("train", num_units=20, docs_per_unit=3), sd.TaskDocumentSource("val", num_units=20, docs_per_unit=3)
    assert train.num_units == 19 and val.num_units == 1
    assert train.read_unit(0) == sd.TaskDocumentSource("train", num_units=20, docs_per_unit=3).read_unit(0)
    assert train.read_unit(0) != val.read_unit(0) and len(train.read_unit(1)) == 3
    with pytest.raises(IndexError):
        train.read_unit(19)


# ---------------------------------------------------------------------------------------------- Chinese


def test_chinese_arithmetic_calls_the_calculator_with_the_same_expression():
    from portachat.engine.calculator import calculate

    examples = [ex for ex in st.task_examples(3000, "train", seed=21, tasks=["calc_arithmetic"])]
    zh = [ex for ex in examples if ex.lang == "zh"]
    assert 0.4 < len(zh) / len(examples) < 0.6  # the default mix is about half Chinese
    assert any("加" in ex.question for ex in zh) and any("乘以" in ex.question for ex in zh)
    for ex in zh:
        call, output, final = ex.assistant
        a, op, b = re.fullmatch(r"(\d+)([+\-*])(\d+)", call["text"]).groups()
        assert call["type"] == "python" and output == {"type": "python_output", "text": ex.answer}
        assert calculate(call["text"]) == ex.answer  # the inference engine's own calculator agrees
        assert final == {"type": "text", "text": f"答案：{ex.answer}。"}
        assert heldout.question_key(ex.question) == ex.key == f"calc:{int(a)}{op}{int(b)}"
    # short sums like the are trained too, not only the three-digit operands most values have
    sums = [ex.key for ex in examples if "+" in ex.key]
    assert sum(bool(re.fullmatch(r"calc:\d\d\+\d\d", k)) for k in sums) > 0.1 * len(sums)
    # the question: the same key (and split) as its English phrasing, the same tool call
    assert heldout.question_key("23加58等于多少？") == heldout.question_key("What is 23+58?") == "calc:23+58"
    en = next(ex for ex in examples if ex.lang == "en")
    assert en.assistant[0]["text"] == re.sub(r"\s", "", re.search(r"\d+ ?[+\-*] ?\d+|\d+ \w+ \d+", en.question)[0]
                                              .replace(" plus ", "+").replace(" minus ", "-").replace(" times ", "*"))


def test_every_tool_call_is_evaluated_right_by_the_engine_calculator_in_both_languages():
    from portachat.engine.calculator import calculate

    calls = 0
    for ex in st.task_examples(1500, "train", seed=22) + st.task_examples(300, "heldout", seed=22):
        for i, part in enumerate(ex.assistant):
            if part["type"] == "python":
                assert calculate(part["text"]) == ex.assistant[i + 1]["text"] == ex.answer, ex
                calls += 1
    chinese_counts = [ex for ex in st.task_examples(2000, seed=23, tasks=["letter_count"]) if "“" in ex.question]
    assert chinese_counts and all(re.fullmatch(r"'[^\x00-\x7f]+'\.count\('[^\x00-\x7f]'\)", ex.assistant[0]["text"])
                                  for ex in chinese_counts)
    assert calls > 800


def test_chinese_answers_are_extracted_and_verified():
    ex = next(e for e in st.task_examples(200, seed=24) if e.lang == "zh" and e.task == "calc_arithmetic")
    wrong = str(int(ex.answer) + 1)
    assert ex.verify(f"<|python_start|>1+1<|python_end|><|output_start|>2<|output_end|>答案：{ex.answer}。")
    assert ex.verify(f"答案: {ex.answer}") and ex.verify(f"The answer is {ex.answer}.")
    assert not ex.verify(f"答案：{wrong}。") and not ex.verify(ex.answer)
    assert not ex.verify(f"答案：{ex.answer}。 The answer is {wrong}.")  # the last final answer counts
    assert st.extract_answer("较大的是第二个，52。答案：52。") == "52"
    assert st.normalize_answer("“是”") == "是"


def _heldout_questions_by_language() -> dict[str, set[str]]:
    return {lang: {ex.question for ex in st.heldout_set(600, seed=0, zh_fraction=float(lang == "zh"))}
            for lang in st.LANGS}


def _line_questions(docs: list[str]) -> set[str]:
    """Every line of the documents with a Q/A prefix removed (a question starts its line)."""
    prefixes = ("Question: ", "Q: ", "问题：", "问：")
    lines = {line.strip() for d in docs for line in d.split("\n")}
    return {line[len(p):] if line.startswith(p) else line for line in lines for p in [next(
        (p for p in prefixes if line.startswith(p)), "")]}


def test_heldout_questions_never_reach_training_in_either_language():
    from portachat.data.synthetic.documents import SyntheticSource

    held = _heldout_questions_by_language()
    assert all(len(qs) == 600 for qs in held.values())
    # chat data: keys (content, whatever the language) never cross the split
    train = st.task_examples(6000, "train", seed=0)
    assert not {ex.key for ex in train} & {ex.key for ex in st.heldout_set(600, seed=0)}
    assert {ex.lang for ex in train} == {"en", "zh"}
    turns = [ex for d in st.dialogues(2000, "train", seed=0, mixed_turns=0.5) for ex in d]
    assert all(ex.split == "train" for ex in turns)
    # pretraining documents (plain curriculum + chat phrasing) of both languages
    source = SyntheticSource(num_units=50, docs_per_unit=64)
    docs = [doc for u in range(10) for doc in source.read_unit(u)]
    lines = _line_questions(docs)
    for lang, questions in held.items():
        leaked = {q for q in questions for line in lines if line.startswith(q)}
        assert not leaked, (lang, sorted(leaked)[:5])
    # the check is not vacuous: train questions of both languages do start lines of those documents
    trained = {lang: {ex.question for ex in train if ex.lang == lang} for lang in st.LANGS}
    assert all(len(trained[lang] & lines) > 20 for lang in st.LANGS)


def test_bilingual_conversations_switch_language_between_turns():
    from portachat.data.chat_data import synthetic_conversations

    two = st.dialogues(300, seed=25, mixed_turns=1.0)
    assert all(len(d) == 2 and d[0].lang != d[1].lang for d in two)
    assert {d[1].lang for d in two} == {"en", "zh"}
    convs = synthetic_conversations(400, seed=26, mixed_turns=0.25)
    multi = [c for c in convs if len(c["messages"]) == 4]
    assert 50 < len(multi) < 150 and all(len(c["messages"]) in (2, 4) for c in convs)
    for c in multi:
        roles = [m["role"] for m in c["messages"]]
        assert roles == ["user", "assistant", "user", "assistant"]
        first, last = c["messages"][0]["content"], c["messages"][2]["content"]
        cjk = [bool(re.search(r"[\u4e00-\u9fff]", q)) for q in (first, last)]
        assert cjk[0] != cjk[1] and cjk[1] == (c["lang"] == "zh")
        assert solve(last) == c["answer"]
    # without mixed turns the conversations are single questions, and the mix follows zh_fraction
    assert all(len(c["messages"]) == 2 for c in synthetic_conversations(100, seed=26))
    assert {ex.lang for ex in st.task_examples(200, seed=27, zh_fraction=0.0)} == {"en"}
    assert {ex.lang for ex in st.task_examples(200, seed=27, zh_fraction=1.0)} == {"zh"}
    with pytest.raises(ValueError, match="zh_fraction"):
        st.task_examples(1, zh_fraction=1.5)


def test_chinese_conversations_render_short(small_tokenizer):
    zh = [c for c in st.conversations(200, seed=28, zh_fraction=1.0)]
    for conv in zh:
        ids, mask = render_conversation(small_tokenizer, conv)
        assert sum(mask) > 0 and len(ids) < 400  # a byte-level test tokenizer: Chinese costs up to 3 tokens/char
