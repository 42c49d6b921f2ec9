"""The held-out rule of the synthetic curriculum: every question has a canonical key (its task and
content, not its phrasing or language) and a hash of the key puts it in "train" or "heldout" (~10%),
so no phrasing of a held-out question, in either language, is ever trained on - in the chat stages
(tasks.py) or in pretraining documents (documents.py)."""

from __future__ import annotations

import hashlib
import re

HELDOUT_PER_MILLE = 100  # ~10% of questions are held out


def split_of(key: str) -> str:
    """'heldout' for ~10% of keys, else 'train'; a pure function of the key."""
    h = int.from_bytes(hashlib.sha256(f"portachat-task:{key}".encode()).digest()[:8], "big")
    return "heldout" if h % 1000 < HELDOUT_PER_MILLE else "train"



_ZH_OPS = {"加": "+", "减": "-", "乘以": "*", "plus": "+", "minus": "-", "times": "*"}


def question_key(question: str) -> str | None:
    """The canonical key of a question in any of the curriculum's phrasings, English or Chinese (None
    if it is none of them), so other generators - e.g. the base pretraining documents of documents.py,
    which ask some of the same questions - can leave out held-out ones: `split_of(key) == "heldout"`."""
    q = question.strip()
    if m := re.fullmatch(r"(?:What is|Calculate) (\d+) ?([+\-*]) ?(\d+)[?.]|(\d+) ?([+\-*]) ?(\d+)等于多少？"
                         r"|计算(\d+)([+\-*])(\d+)。", q):
        a, op, b = (x for x in m.groups() if x is not None)
        return f"calc:{int(a)}{op}{int(b)}"
    if m := re.fullmatch(r"What is (\d+) (plus|minus|times) (\d+)\?|(\d+)(加|减|乘以)(\d+)等于多少？", q):
        a, op, b = (x for x in m.groups() if x is not None)
        return f"calc:{int(a)}{_ZH_OPS[op]}{int(b)}"
    if m := re.fullmatch(r"What is (\d+) \+ (\d+) without the calculator\?|Without the calculator, what is (\d+) \+ (\d+)\?"
                         r"|Add (\d+) and (\d+) in your head\.|不用计算器，(\d+)\+(\d+)等于多少？|心算(\d+)加(\d+)。"
                         r"|(\d+) \+ (\d+)等于多少？请心算。", q):
        a, b = (int(x) for x in m.groups() if x is not None)
        return f"mental:{a}+{b}"
    if m := re.fullmatch(r"How many times does the letter (\w) appear in (\w+)\?|How many (\w)'s are in (\w+)\?"
                         r"|Count the letter (\w) in (\w+)\.", q):
        letter, word = (x for x in m.groups() if x is not None)
        return f"count:{word}:{letter}"
    if m := re.fullmatch(r"([a-z]+)里有几个([a-z])？|单词([a-z]+)中字母([a-z])出现了几次？|数一数([a-z]+)里的字母([a-z])。"
                         r"|“(\w+)”里有几个“(\w)”字？|“(\w+)”中“(\w)”字出现了几次？", q):
        word, letter = (x for x in m.groups() if x is not None)
        return f"count:{word}:{letter}"
    if m := re.fullmatch(r"Which (?:number )?is (larger|smaller)[,:] (\d+) or (\d+)\?", q):
        return f"compare:{m[1]}:{int(m[2])}:{int(m[3])}"
    if m := re.fullmatch(r"(\d+)和(\d+)(?:哪个|，哪个数更)([大小])？", q):
        return f"compare:{'larger' if m[3] == '大' else 'smaller'}:{int(m[1])}:{int(m[2])}"
    if m := re.fullmatch(r"Is (\d+) (less|greater) than (\d+)\?", q):
        return f"compare:{m[2]}:{int(m[1])}:{int(m[3])}"
    if m := re.fullmatch(r"(\d+)比(\d+)([大小])吗？", q):
        return f"compare:{'less' if m[3] == '小' else 'greater'}:{int(m[1])}:{int(m[2])}"
    if m := re.fullmatch(r"Is (\d+) larger or smaller than (\d+)\?|(\d+)比(\d+)大还是小？", q):
        a, b = (int(x) for x in m.groups() if x is not None)
        return f"compare:relation:{a}:{b}"
    if m := re.fullmatch(r"(?:How do you spell|Spell the word|Spell) (\w+)[?.]|([a-z]+)怎么拼写？|拼写单词([a-z]+)。"
                         r"|([a-z]+)这个词怎么拼？", q):
        return f"spell:{next(x for x in m.groups() if x is not None)}"
    return None
