from __future__ import annotations

import re
from collections import Counter

import pytest
from data_helpers import ByteTokenizer

from portachat.data.loader import PackedLoader
from portachat.data.synthetic import curriculum as synthetic
from portachat.data.synthetic.curriculum import TASKS, number_to_words, synthetic_examples, synthetic_qa
from portachat.data.synthetic.documents import SyntheticSource, synthetic_documents

WORD_TO_NUMBER = {number_to_words(i): i for i in range(1000)}


def solve(question: str) -> str:
    """An independent solver for every question form the curriculum asks."""
    if m := re.fullmatch(r"What is ([\d+\-*() ]+)\?", question):
        return str(eval(m[1], {"__builtins__": {}}))  # only digits, operators, parentheses
    if m := re.fullmatch(r"What is ([a-z\- ]+) (plus|times) ([a-z\- ]+)\?", question):
        a, b = WORD_TO_NUMBER[m[1]], WORD_TO_NUMBER[m[3]]
        return number_to_words(a + b if m[2] == "plus" else a * b)
    if m := re.fullmatch(r"\w+ has (\d+) \w+ and gets (\d+) more\. .*", question):
        return str(int(m[1]) + int(m[2]))
    if m := re.fullmatch(r"\w+ has (\d+) \w+ and gives away (\d+)\. .*", question):
        return str(int(m[1]) - int(m[2]))
    if m := re.fullmatch(r"How many letters are in the word (\w+)\?", question):
        return str(len(m[1]))
    if m := re.fullmatch(r"How many times does the letter (\w) appear in (\w+)\?", question):
        return str(m[2].count(m[1]))
    if m := re.fullmatch(r"How many items are in this list: (.+)\?", question):
        return str(len(m[1].split(", ")))
    if m := re.fullmatch(r"How do you spell (\w+)\?", question):
        return "-".join(m[1])
    if m := re.fullmatch(r"What is the (first|last) letter of (\w+)\?", question):
        return m[2][0] if m[1] == "first" else m[2][-1]
    if m := re.fullmatch(r"What is (\w+) spelled backwards\?", question):
        return m[1][::-1]
    if m := re.fullmatch(r"Which is (larger|smaller), (\d+) or (\d+)\?", question):
        pick = max if m[1] == "larger" else min
        return str(pick(int(m[2]), int(m[3])))
    if m := re.fullmatch(r"Is (\d+) (less|greater) than (\d+)\?", question):
        a, b = int(m[1]), int(m[3])
        return "yes" if (a < b if m[2] == "less" else a > b) else "no"
    if m := re.fullmatch(r"What is the (largest|smallest) number in ([\d, ]+)\?", question):
        nums = [int(x) for x in m[2].split(", ")]
        return str(max(nums) if m[1] == "largest" else min(nums))
    if m := re.fullmatch(r"What is the capital of (.+)\?", question):
        return synthetic.CAPITALS[m[1]]
    if m := re.fullmatch(r"What color is (.+)\?", question):
        return synthetic.COLORS[m[1]]
    if m := re.fullmatch(r"What sound does a (\w+) make\?", question):
        return synthetic.ANIMAL_SOUNDS[m[1]]
    if m := re.fullmatch(r"What day comes (after|before) (\w+)\?", question):
        i = synthetic.DAYS.index(m[2])
        return synthetic.DAYS[(i + (1 if m[1] == "after" else -1)) % 7]
    if m := re.fullmatch(r"What month comes after (\w+)\?", question):
        return synthetic.MONTHS[(synthetic.MONTHS.index(m[1]) + 1) % 12]
    raise AssertionError(f"unknown question form: {question!r}")


def test_every_answer_is_correct():
    examples = synthetic_examples(3000, seed=1)
    for ex in examples:
        assert solve(ex.question) == ex.answer, ex
        assert ex.answer in ex.statement or ex.task == "comparison", ex
    tasks = Counter(ex.task for ex in examples)
    assert set(tasks) == set(TASKS) and min(tasks.values()) > 400  # all tasks, roughly evenly


def test_number_words():
    assert number_to_words(0) == "zero" and number_to_words(42) == "forty-two"
    assert number_to_words(115) == "one hundred fifteen" and number_to_words(3000) == "three thousand"
    with pytest.raises(ValueError):
        number_to_words(-1)


def test_deterministic_and_seeded():
    assert synthetic_documents(20, seed=3) == synthetic_documents(20, seed=3)
    assert synthetic_documents(20, seed=3) != synthetic_documents(20, seed=4)
    assert synthetic_qa(10, 7) == synthetic_qa(10, 7)
    qa = synthetic_qa(500, 0)
    assert all(isinstance(q, str) and isinstance(a, str) and q.endswith("?") for q, a in qa)
    assert len(set(qa)) > 300  # varied, not a handful of repeats


def test_documents_are_varied_and_contain_answers():
    docs = synthetic_documents(400, seed=0)
    assert all(docs) and len(set(docs)) >= len(docs) - 4  # a one-fact document may repeat by chance
    styles = Counter("Question:" in d for d in docs) + Counter("Q: " in d for d in docs)
    assert styles[True] > 50 and styles[False] > 50
    assert any(re.search(r"\d+ \+ \d+ = \d+", d) for d in docs)
    assert any(" is spelled " in d for d in docs)
    lengths = sorted(len(d) for d in docs)
    assert 10 < lengths[len(lengths) // 2] < 400


def test_subset_of_tasks_and_unknown_task():
    assert {ex.task for ex in synthetic_examples(100, tasks=("facts",))} == {"facts"}
    with pytest.raises(ValueError, match="unknown synthetic task"):
        synthetic_examples(1, tasks=("poetry",))


def test_synthetic_source_units():
    train = SyntheticSource(num_units=200, docs_per_unit=8)
    val = SyntheticSource("val", num_units=200, docs_per_unit=8)
    assert (train.num_units, val.num_units) == (190, 10)
    assert train.read_unit(5) == SyntheticSource(num_units=200, docs_per_unit=8).read_unit(5)
    assert len(train.read_unit(0)) == 8 and train.read_unit(0) != train.read_unit(1)
    assert set(val.read_unit(0)).isdisjoint(train.read_unit(0))
    assert SyntheticSource(seed=1).read_unit(0) != SyntheticSource(seed=0).read_unit(0)
    with pytest.raises(IndexError):
        train.read_unit(190)


def test_synthetic_source_feeds_the_loader_fast():
    import time

    loader = PackedLoader(SyntheticSource(), ByteTokenizer(), batch_size=16, seq_len=256, stream=3, num_streams=8)
    start = time.perf_counter()
    for _ in range(20):
        x, _ = loader.next_batch()
    assert (x[:, 0] == ByteTokenizer.bos_id).all()
    assert time.perf_counter() - start < 5.0
