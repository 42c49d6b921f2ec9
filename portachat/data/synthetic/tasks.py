"""The synthetic task curriculum for the chat stages (mid, SFT, RL) and its held-out evaluation.

Each task draws a question from a generator `rng -> TaskExample`: the conversation in our chat
format (portachat/tokenizer/chat.py, assistant content as parts, tool calls included) and the
expected final answer, which `TaskExample.verify(reply)` / `.reward(reply)` check. The tasks are
designed to be LEARNABLE by a tiny model in minutes of CPU training: short prompts, a few phrasing
templates, and one final form for every answer, "The answer is X.". Where the work is beyond a tiny
model (multi-digit arithmetic, counting letters) the assistant calls the calculator tool and copies
its output, which only needs attention to copy; the tool-free tasks are built from steps that all
occur in training (column addition digit by digit, comparing numbers digit by digit, spelling known
words).

Tasks (each asked in English or, with probability `zh_fraction` = 0.5 by default, in Chinese):
  calc_arithmetic     "What is 23+58?"            python `23+58` -> 81 -> "The answer is 81."
                      "23加58等于多少？"           python `23+58` -> 81 -> "答案：81。"
  mental_arithmetic   "What is 47 + 35 without the calculator?"  column addition spelled out
                      "不用计算器，47+35等于多少？"  "7 + 5 = 12，写2进1。4 + 3 + 1 = 8。答案：82。"
  letter_count        "How many r's are in strawberry?"  python `'strawberry'.count('r')` -> 3
                      "strawberry里有几个r？", "“妈妈”里有几个“妈”字？"  python `'妈妈'.count('妈')` -> 2
  comparison          "Is 47 less than 52?"  "Tens 4 and 5: 4 < 5, so 47 < 52. Less? Yes." -> yes
                      "Which is larger, 47 or 52?"  "... so 47 < 52. The larger is the second, 52."
                      "37比52大还是小？"  "十位3和5：3 < 5，所以37 < 52。答案：小。"
  spelling            "How do you spell apple?"  -> "The answer is a-p-p-l-e."  ("apple怎么拼写？")

The tool calls are the same tokens in both languages; only the text around them is Chinese, and the
final form is "答案：X。" (both forms are accepted by `extract_answer`). Bilingual conversations
(`dialogues(..., mixed_turns=...)`): a question in one language answered in it, then one in the
other language; mid-training and SFT use a share `MIXED_TURNS` of them.

Splits: every question has a canonical key (the task and its content, not its phrasing or its
language); a hash of the key puts it in "train" or "heldout" (~10%), so the held-out split is
disjoint from the train split by construction, whatever the seed, and no phrasing of a held-out
question, in either language, is ever trained on.
Everything is deterministic in the seed (Python's `random.Random` seeded with a string).

The tool calls use the forms the calculator of the inference engine evaluates (nanochat's): plain
arithmetic over integers, and `'word'.count('letter')`.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from portachat.data.synthetic.common import WORDS
from portachat.data.synthetic.heldout import split_of
from portachat.data.synthetic.zh import ZH_OTHER_CHARS, ZH_WORDS
from portachat.i18n import _

SPLITS = ("train", "heldout")
ANSWER_PREFIX = "The answer is "
ANSWER_PREFIXES = {"en": ANSWER_PREFIX, "zh": "答案："}
LANGS = ("en", "zh")
ZH_FRACTION = 0.5  # the share of questions asked (and answered) in Chinese by default
MIXED_TURNS = 0.1  # the share of mid/SFT conversations with a first turn in the other language


# ----------------------------------------------------------------------------------------------
# answers: one final form per language, one normaliser, one checker


def final_segment(reply: str) -> str:
    """The assistant's text after its last tool result (tool calls and outputs are not the answer)."""
    for marker in ("<|output_end|>", "<|python_end|>"):
        if marker in reply:
            reply = reply.rsplit(marker, 1)[1]
    return re.sub(r"<\|[a-z_]+\|>", "", reply).strip()


def extract_answer(reply: str) -> str | None:
    """The X of the last "The answer is X." or "答案：X。" in the reply's final segment, or None."""
    text = final_segment(reply)
    lowered = text.lower()
    found = [(i, len(p)) for p in (*ANSWER_PREFIXES.values(), "答案:") if (i := lowered.rfind(p.lower())) >= 0]
    if not found:
        return None
    idx, width = max(found)
    answer = text[idx + width:].strip().split("\n", 1)[0].strip()
    return answer[:-1].strip() if answer.endswith((".", "。")) else answer


def normalize_answer(text: str) -> str:
    """Case, surrounding spaces/quotes and thousands separators do not matter."""
    text = text.strip().strip("\"'`“”‘’").strip().lower()
    if re.fullmatch(r"-?[\d,]+(\.\d+)?", text):
        text = text.replace(",", "")
    return text


# ----------------------------------------------------------------------------------------------
# examples


@dataclass(frozen=True)
class TaskExample:
    task: str
    key: str  # canonical content of the question, the same in every language: decides the split
    question: str
    answer: str  # the expected final answer (what follows "The answer is " / "答案：")
    assistant: list[dict[str, str]] = field(default_factory=list)  # the reference reply, as parts
    lang: str = "en"  # the language of the question and of the reply's text

    @property
    def split(self) -> str:
        return split_of(self.key)

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The full conversation (for SFT): the user's question and the reference reply."""
        return [{"role": "user", "content": self.question}, {"role": "assistant", "content": list(self.assistant)}]

    @property
    def prompt(self) -> list[dict[str, Any]]:
        """The conversation up to the reply (for RL rollouts and evaluation)."""
        return [{"role": "user", "content": self.question}]

    def verify(self, reply: str) -> bool:
        """True when the reply's final answer equals the expected one."""
        got = extract_answer(reply)
        return got is not None and normalize_answer(got) == normalize_answer(self.answer)

    def reward(self, reply: str) -> float:
        """RL reward: 1 for a correct final answer, else 0."""
        return 1.0 if self.verify(reply) else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: a `messages` conversation plus what a verifier needs."""
        return {"task": self.task, "lang": self.lang, "question": self.question, "answer": self.answer,
                "messages": self.messages}


def _text(text: str) -> dict[str, str]:
    return {"type": "text", "text": text}


def _final(answer: str, lang: str) -> str:
    return f"{ANSWER_PREFIXES[lang]}{answer}{'。' if lang == 'zh' else '.'}"


def _tool(expr: str, output: str) -> list[dict[str, str]]:
    return [{"type": "python", "text": expr}, {"type": "python_output", "text": output}]


# ----------------------------------------------------------------------------------------------
# task generators: (rng, lang) -> TaskExample; the key (the content) does not depend on the language.

_OPS = {"+": ("plus", lambda a, b: a + b), "-": ("minus", lambda a, b: a - b), "*": ("times", lambda a, b: a * b)}
_OPS_ZH = {"+": "加", "-": "减", "*": "乘以"}


def calc_arithmetic(rng: random.Random, lang: str = "en") -> TaskExample:
    """Multi-digit +, -, * through the calculator: the model copies the operands and the result."""
    op = rng.choice("++-*")
    if op == "*":
        a, b = rng.randint(2, 99), rng.randint(2, 99)
    else:
        # Two- and three-digit operands alike (uniform values would make 91% of them three digits, and
        # a 3-layer model then copied "23加58" as 23+358: the operand length it had nearly always seen).
        a, b = (rng.randint(10, 99) if rng.random() < 0.4 else rng.randint(100, 999) for _ in range(2))
        if op == "-" and b > a:
            a, b = b, a
    word, fn = _OPS[op]
    result = str(fn(a, b))
    if lang == "zh":
        question = rng.choice((
            f"{a}{_OPS_ZH[op]}{b}等于多少？",
            f"{a}{_OPS_ZH[op]}{b}等于多少？",
            f"{a}{op}{b}等于多少？",
            f"计算{a}{op}{b}。",
            f"{a} {op} {b}等于多少？",
        ))
    else:
        question = rng.choice((
            f"What is {a}{op}{b}?",
            f"What is {a}{op}{b}?",
            f"What is {a} {op} {b}?",
            f"Calculate {a}{op}{b}.",
            f"What is {a} {word} {b}?",
        ))
    return TaskExample("calc_arithmetic", f"calc:{a}{op}{b}", question, result,
                       [*_tool(f"{a}{op}{b}", result), _text(_final(result, lang))], lang)


def mental_arithmetic(rng: random.Random, lang: str = "en") -> TaskExample:
    """Two-digit addition without the tool, worked column by column; every step is a one-digit sum."""
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    ones = a % 10 + b % 10
    carry = ones // 10
    tens = a // 10 + b // 10 + carry
    result = str(a + b)
    if lang == "zh":
        question = rng.choice((f"不用计算器，{a}+{b}等于多少？", f"心算{a}加{b}。", f"{a} + {b}等于多少？请心算。"))
        if carry:
            steps = f"{a % 10} + {b % 10} = {ones}，写{ones % 10}进1。{a // 10} + {b // 10} + 1 = {tens}。"
        else:
            steps = f"{a % 10} + {b % 10} = {ones}，写{ones}。{a // 10} + {b // 10} = {tens}。"
    else:
        question = rng.choice((
            f"What is {a} + {b} without the calculator?",
            f"Without the calculator, what is {a} + {b}?",
            f"Add {a} and {b} in your head.",
        ))
        if carry:
            steps = f"{a % 10} + {b % 10} = {ones}, write {ones % 10} and carry 1. {a // 10} + {b // 10} + 1 = {tens}. "
        else:
            steps = f"{a % 10} + {b % 10} = {ones}, write {ones}. {a // 10} + {b // 10} = {tens}. "
    return TaskExample("mental_arithmetic", f"mental:{a}+{b}", question, result,
                       [_text(steps + _final(result, lang))], lang)


def letter_count(rng: random.Random, lang: str = "en") -> TaskExample:
    """Occurrences of a letter in a word (or, in Chinese, of a character in a Chinese word) through
    the calculator's str.count."""
    chinese_word = lang == "zh" and rng.random() < 0.5
    words, others = (ZH_WORDS, ZH_OTHER_CHARS) if chinese_word else (WORDS, "abcdefghijklmnopqrstuvwxyz")
    word = rng.choice(words)
    letter = rng.choice(word) if rng.random() < 0.85 else rng.choice(others)
    if chinese_word:
        question = rng.choice((f"“{word}”里有几个“{letter}”字？", f"“{word}”中“{letter}”字出现了几次？"))
    elif lang == "zh":
        question = rng.choice((f"{word}里有几个{letter}？", f"单词{word}中字母{letter}出现了几次？",
                               f"数一数{word}里的字母{letter}。"))
    else:
        question = rng.choice((
            f"How many times does the letter {letter} appear in {word}?",
            f"How many {letter}'s are in {word}?",
            f"Count the letter {letter} in {word}.",
        ))
    result = str(word.count(letter))
    return TaskExample("letter_count", f"count:{word}:{letter}", question, result,
                       [*_tool(f"'{word}'.count('{letter}')", result), _text(_final(result, lang))], lang)


def compare_steps(a: int, b: int, kind: str, lang: str = "en") -> str:
    """The worked comparison of two numbers below 100, one small step at a time: the tens digits are
    copied (0 for a one-digit number) and compared (<, = or >), on a tie the ones the same way, then
    the relation of the two numbers in the question's order: "Tens 7 and 7: 7 = 7. Ones 8 and 3: 8 > 3,
    so 78 > 73. ". "Which is larger/smaller" then names the number's place before copying it: "The
    larger is the first, 78. "; "Is 78 less than 73?" repeats the word asked about next to the
    relation before answering: "Less? No. "; "Is 78 larger or smaller than 73?" answers from the
    relation just written. Each step reads only the last few tokens or copies a number or word in
    place. A 3-layer model answering in one step stayed near chance; picking the answer's digits
    without naming its place first mixed the digits of the two numbers ("71" for 72 or 39) on up to
    half of those questions; answering yes/no from the question's word far back left some seeds at
    chance; comparing the tens before writing both got a fifth of them wrong. Chinese replies take
    the same steps in Chinese words ("十位7和7：7 = 7。个位8和3：8 > 3，所以78 > 73。")."""
    sym = "<" if a < b else ">"
    (ta, oa), (tb, ob) = divmod(a, 10), divmod(b, 10)
    zh = lang == "zh"
    rel = "=" if ta == tb else sym
    steps = f"十位{ta}和{tb}：{ta} {rel} {tb}" if zh else f"Tens {ta} and {tb}: {ta} {rel} {tb}"
    if ta == tb:
        steps += f"。个位{oa}和{ob}：{oa} {sym} {ob}" if zh else f". Ones {oa} and {ob}: {oa} {sym} {ob}"
    steps += f"，所以{a} {sym} {b}。" if zh else f", so {a} {sym} {b}. "
    if kind in ("larger", "smaller"):
        first = (a > b) == (kind == "larger")
        if zh:
            return steps + f"较{'大' if kind == 'larger' else '小'}的是第{'一' if first else '二'}个，{a if first else b}。"
        return steps + f"The {kind} is the {'first' if first else 'second'}, {a if first else b}. "
    if kind == "relation":
        return steps
    holds = (a < b) == (kind == "less")
    if zh:
        return steps + f"{'小' if kind == 'less' else '大'}吗？{'是' if holds else '否'}。"
    return steps + f"{kind.capitalize()}? {'Yes' if holds else 'No'}. "


def comparison(rng: random.Random, lang: str = "en") -> TaskExample:
    """Which of two numbers is larger/smaller, is one less/greater than the other, or is it larger or
    smaller than the other, worked digit by digit."""
    a, b = rng.sample(range(0, 100), 2)
    kind = rng.choice(("larger", "smaller", "less", "greater", "relation"))
    zh = lang == "zh"
    if kind in ("larger", "smaller"):
        answer = str(max(a, b) if kind == "larger" else min(a, b))
        big = "大" if kind == "larger" else "小"
        question = rng.choice((f"{a}和{b}哪个{big}？", f"{a}和{b}，哪个数更{big}？") if zh else
                              (f"Which is {kind}, {a} or {b}?", f"Which number is {kind}: {a} or {b}?"))
    elif kind == "relation":
        answer = ("小" if a < b else "大") if zh else ("smaller" if a < b else "larger")
        question = f"{a}比{b}大还是小？" if zh else f"Is {a} larger or smaller than {b}?"
    else:
        holds = a < b if kind == "less" else a > b
        answer = ("是" if holds else "否") if zh else ("yes" if holds else "no")
        question = f"{a}比{b}{'小' if kind == 'less' else '大'}吗？" if zh else f"Is {a} {kind} than {b}?"
    return TaskExample("comparison", f"compare:{kind}:{a}:{b}", question, answer,
                       [_text(compare_steps(a, b, kind, lang) + _final(answer, lang))], lang)


def spelling(rng: random.Random, lang: str = "en") -> TaskExample:
    """Spell a known (English) word letter by letter."""
    word = rng.choice(WORDS)
    if lang == "zh":
        question = rng.choice((f"{word}怎么拼写？", f"拼写单词{word}。", f"{word}这个词怎么拼？"))
    else:
        question = rng.choice((f"How do you spell {word}?", f"Spell the word {word}.", f"Spell {word}."))
    spelled = "-".join(word)
    return TaskExample("spelling", f"spell:{word}", question, spelled, [_text(_final(spelled, lang))], lang)


TASKS: dict[str, Callable[[random.Random, str], TaskExample]] = {
    "calc_arithmetic": calc_arithmetic,
    "mental_arithmetic": mental_arithmetic,
    "letter_count": letter_count,
    "comparison": comparison,
    "spelling": spelling,
}

# How often each task is drawn by default: most weight on what a tiny model learns reliably. (A 0.7M
# model trained from scratch for 900 steps of 16 conversations reached 63% held-out: the two tool
# tasks ~90%, comparison near chance, column addition and spelling 0%. Held-out spelling words are
# never spelled in the train split, so spelling measures what pretraining taught about letters.)
DEFAULT_WEIGHTS: dict[str, float] = {
    "calc_arithmetic": 0.35,
    "mental_arithmetic": 0.15,
    "letter_count": 0.25,
    "comparison": 0.2,
    "spelling": 0.05,
}


# ----------------------------------------------------------------------------------------------
# sampling


def _check_zh_fraction(zh_fraction: float) -> float:
    if not 0.0 <= zh_fraction <= 1.0:
        raise ValueError(f"zh_fraction must be between 0 and 1, got {zh_fraction}")
    return float(zh_fraction)


def sample_task(name: str, rng: random.Random, split: str, lang: str = "en") -> TaskExample:
    """One example of task `name` in `lang` from `split` (rejection sampling on the key's split)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if name not in TASKS:
        raise ValueError(f"unknown synthetic task {name!r}; known: {sorted(TASKS)}")
    if lang not in LANGS:
        raise ValueError(f"lang must be one of {LANGS}, got {lang!r}")
    for _attempt in range(10_000):
        ex = TASKS[name](rng, lang)
        if ex.split == split:
            return ex
    raise RuntimeError(f"task {name!r} produced no {split} example in 10000 draws")  # never for these tasks


def task_examples(
    n: int,
    split: str = "train",
    seed: int | str = 0,
    tasks: Sequence[str] | None = None,
    weights: dict[str, float] | None = None,
    zh_fraction: float = ZH_FRACTION,
) -> list[TaskExample]:
    """n examples of `split`, tasks drawn by `weights` (default DEFAULT_WEIGHTS), each asked in Chinese
    with probability `zh_fraction` (else English), deterministic in seed.

    The held-out split never shares a question key with the train split, whatever the seeds and in
    either language: the key is the question's content, not its phrasing.
    """
    names = list(tasks) if tasks is not None else list(TASKS)
    unknown = [t for t in names if t not in TASKS]
    if unknown:
        raise ValueError(_("unknown synthetic task(s) {unknown}; known: {known}").format(
            unknown=", ".join(unknown), known=", ".join(sorted(TASKS))))
    w = weights or DEFAULT_WEIGHTS
    probs = [float(w.get(t, 1.0 / len(names))) for t in names]
    if any(p < 0 for p in probs) or sum(probs) <= 0:
        raise ValueError(f"task weights must be >= 0 with a positive sum, got {dict(zip(names, probs, strict=True))}")
    zh_fraction = _check_zh_fraction(zh_fraction)
    rng = random.Random(f"portachat-tasks:{split}:{seed}")
    out = []
    for _example in range(n):
        name = rng.choices(names, probs)[0]
        lang = "zh" if rng.random() < zh_fraction else "en"
        out.append(sample_task(name, rng, split, lang))
    return out


def heldout_set(n: int = 200, seed: int | str = 0, tasks: Sequence[str] | None = None,
                zh_fraction: float = ZH_FRACTION) -> list[TaskExample]:
    """The held-out evaluation set: `n` distinct held-out questions (distinct keys), deterministic in seed."""
    out: dict[str, TaskExample] = {}
    batch_seed = 0
    while len(out) < n:
        for ex in task_examples(n, "heldout", f"{seed}:{batch_seed}", tasks, zh_fraction=zh_fraction):
            if ex.key not in out and len(out) < n:
                out[ex.key] = ex
        batch_seed += 1
        if batch_seed > 50:
            break  # the held-out space of the chosen tasks is smaller than n: return what exists
    return list(out.values())


def dialogues(
    n: int,
    split: str = "train",
    seed: int | str = 0,
    tasks: Sequence[str] | None = None,
    weights: dict[str, float] | None = None,
    zh_fraction: float = ZH_FRACTION,
    mixed_turns: float = 0.0,
) -> list[list[TaskExample]]:
    """n dialogues of `split`: `task_examples` one question each, and with probability `mixed_turns`
    an earlier turn in the other language before it (a bilingual conversation: an English question
    answered in English, then a Chinese one answered in Chinese, or the reverse)."""
    if not 0.0 <= mixed_turns <= 1.0:
        raise ValueError(f"mixed_turns must be between 0 and 1, got {mixed_turns}")
    last = task_examples(n, split, seed, tasks, weights, zh_fraction)
    if not mixed_turns:
        return [[ex] for ex in last]
    names = list(tasks) if tasks is not None else list(TASKS)
    rng = random.Random(f"portachat-dialogues:{split}:{seed}")
    out = []
    for ex in last:
        if rng.random() < mixed_turns:
            other = "en" if ex.lang == "zh" else "zh"
            out.append([sample_task(rng.choice(names), rng, split, other), ex])
        else:
            out.append([ex])
    return out


def conversations(
    n: int,
    split: str = "train",
    seed: int | str = 0,
    tasks: Sequence[str] | None = None,
    weights: dict[str, float] | None = None,
    zh_fraction: float = ZH_FRACTION,
    mixed_turns: float = 0.0,
) -> list[dict[str, Any]]:
    """n conversations `{"messages": [...]}` for SFT / mid-training."""
    return [{"messages": [m for ex in turns for m in ex.messages]}
            for turns in dialogues(n, split, seed, tasks, weights, zh_fraction, mixed_turns)]
