from __future__ import annotations

import re
from collections import Counter

import pytest

from portachat.data.synthetic import zh
from portachat.data.synthetic.curriculum import TASKS, synthetic_examples
from portachat.data.synthetic.documents import SyntheticSource, synthetic_documents
from portachat.tokenizer.bpe import train_tokenizer

CJK = re.compile(r"[\u4e00-\u9fff]")
CHINESE_TO_NUMBER = {zh.number_to_chinese(i): i for i in range(1000)}


def solve_zh(question: str) -> str:
    """An independent solver for the Chinese questions of the pretraining curriculum."""
    ops = {"加": lambda a, b: a + b, "减": lambda a, b: a - b, "乘以": lambda a, b: a * b}
    if m := re.fullmatch(r"(\d+) ?(加|减|乘以|[+\-*]) ?(\d+)等于多少？", question):
        op = {"+": "加", "-": "减", "*": "乘以"}.get(m[2], m[2])
        return str(ops[op](int(m[1]), int(m[3])))
    if m := re.fullmatch(r"([\d+\-*() ]+)等于多少？", question):
        return str(eval(m[1], {"__builtins__": {}}))  # only digits, operators, parentheses
    if m := re.fullmatch(r"(\w+?)(加|乘以)(\w+)等于多少？", question):
        return zh.number_to_chinese(ops[m[2]](CHINESE_TO_NUMBER[m[1]], CHINESE_TO_NUMBER[m[3]]))
    if m := re.fullmatch(r"(\w+)有(\d+)(\w)\w+，又得到了(\d+)\w。.*", question):
        return str(int(m[2]) + int(m[4]))
    if m := re.fullmatch(r"(\w+)有(\d+)(\w)\w+，送给别人(\d+)\w。.*", question):
        return str(int(m[2]) - int(m[4]))
    if m := re.fullmatch(r"单词([a-z]+)有几个字母？", question):
        return str(len(m[1]))
    if m := re.fullmatch(r"“(\w+)”这个词有几个字？", question):
        return str(len(m[1]))
    if m := re.fullmatch(r"([a-z]+)里有几个([a-z])？", question):
        return str(m[1].count(m[2]))
    if m := re.fullmatch(r"“(\w+)”里有几个“(\w)”字？", question):
        return str(m[1].count(m[2]))
    if m := re.fullmatch(r"这些东西一共有几样：(.+)？", question):
        return str(len(m[1].split("、")))
    if m := re.fullmatch(r"([a-z]+)怎么拼写？", question):
        return "-".join(m[1])
    if m := re.fullmatch(r"([a-z]+)的(第一个|最后一个)字母是什么？", question):
        return m[1][0] if m[2] == "第一个" else m[1][-1]
    if m := re.fullmatch(r"([a-z]+)倒过来拼是什么？", question):
        return m[1][::-1]
    if m := re.fullmatch(r"(\d+)和(\d+)哪个([大小])？", question):
        return str((max if m[3] == "大" else min)(int(m[1]), int(m[2])))
    if m := re.fullmatch(r"(\d+)比(\d+)([大小])吗？", question):
        a, b = int(m[1]), int(m[2])
        return "是" if (a > b if m[3] == "大" else a < b) else "否"
    if m := re.fullmatch(r"([\d、]+)中最(大|小)的数是几？", question):
        nums = [int(x) for x in m[1].split("、")]
        return str(max(nums) if m[2] == "大" else min(nums))
    if m := re.fullmatch(r"(\w+)的首都是哪里？", question):
        return zh.CAPITALS_ZH[m[1]]
    if m := re.fullmatch(r"(\w+)是什么颜色的？", question):
        return zh.COLORS_ZH[m[1]]
    if m := re.fullmatch(r"(\w+)怎么叫？", question):
        return zh.ANIMAL_SOUNDS_ZH[m[1]]
    if m := re.fullmatch(r"(星期.)的(后|前)一天是星期几？", question):
        i = zh.DAYS_ZH.index(m[1])
        return zh.DAYS_ZH[(i + (1 if m[2] == "后" else -1)) % 7]
    if m := re.fullmatch(r"(\w+月)的下一个月是几月？", question):
        return zh.MONTHS_ZH[(zh.MONTHS_ZH.index(m[1]) + 1) % 12]
    raise AssertionError(f"unknown question form: {question!r}")


def test_chinese_number_words():
    assert [zh.number_to_chinese(n) for n in (0, 7, 10, 15, 20, 42, 105, 110, 342, 1005, 2300)] == [
        "零", "七", "十", "十五", "二十", "四十二", "一百零五", "一百一十", "三百四十二", "一千零五", "二千三百"]
    with pytest.raises(ValueError):
        zh.number_to_chinese(100_000)


def test_every_chinese_answer_is_correct_and_every_family_is_there():
    examples = synthetic_examples(3000, seed=1, lang="zh")
    for ex in examples:
        assert ex.lang == "zh" and CJK.search(ex.question), ex
        assert solve_zh(ex.question) == ex.answer, ex
        assert ex.answer in ex.statement or ex.task == "comparison", ex
    tasks = Counter(ex.task for ex in examples)
    assert set(tasks) == set(TASKS) and min(tasks.values()) > 400
    assert any(ex.question == "“苹果”这个词有几个字？" and ex.answer == "2" for ex in synthetic_examples(
        2000, seed=2, tasks=("counting",), lang="zh"))
    with pytest.raises(ValueError, match="lang"):
        synthetic_examples(1, lang="fr")


def test_documents_mix_chinese_and_english():
    docs = synthetic_documents(600, seed=0)
    chinese = [d for d in docs if CJK.search(d)]
    english = [d for d in docs if re.search(r"[A-Za-z]{4}", d) and not CJK.search(d)]
    assert 0.4 < len(chinese) / len(docs) < 0.65 and 0.35 < len(english) / len(docs) < 0.6
    mixed = [d for d in chinese if re.search(r"^(?:Q: |Question: |What|How|Is |Which)", d, re.M)]
    assert mixed  # some documents switch language from one example to the next
    assert any(d.startswith(("问题：", "问：")) for d in chinese)
    assert not any(CJK.search(d) for d in synthetic_documents(200, seed=0, zh_fraction=0.0))
    assert all(CJK.search(d) for d in synthetic_documents(200, seed=0, zh_fraction=1.0))
    # the source the speedrun pretrains on (and trains its tokenizer on) holds both languages
    unit = SyntheticSource(num_units=20, docs_per_unit=64).read_unit(0)
    assert 15 < sum(bool(CJK.search(d)) for d in unit) < 55


def test_the_curriculum_tokenizer_learns_chinese():
    """Trained on the speedrun's source, the BPE merges Chinese characters and phrases: a byte-level
    vocabulary without Chinese would spend 3 tokens on every character (0.33 characters per token)."""
    source = SyntheticSource(num_units=20, docs_per_unit=64)
    tok = train_tokenizer(source.iter_documents(limit_chars=300_000), vocab_size=768, verbose=False)
    text = "\n".join(ex.statement for ex in synthetic_examples(200, seed=3, lang="zh"))
    assert len(text) / len(tok.encode(text)) > 1.0
    assert len(tok.encode("等于多少")) <= 2 and tok.decode(tok.encode("23加58等于多少？")) == "23加58等于多少？"
