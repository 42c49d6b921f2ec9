"""The built-in synthetic curriculum: generated text with verifiable answers, so training runs with no data.

Every task is a generator `rng -> Example` (a question, its answer, and the same fact as a plain
statement). Pretraining documents are rendered from examples with varied templates (documents.py); later stages can
render the same examples as conversations (`synthetic_examples`) and check a model's answers
against `Example.answer`.

Tasks: arithmetic (symbols and words, multi-step, word problems), counting (letters, items),
spelling, comparisons, and simple facts from a small built-in table, in English here and in Chinese
in zh.py; documents are about half Chinese (`ZH_FRACTION`), a few mixing both languages.
Everything is deterministic in the seed (Python's `random.Random`, seeded with a string, is stable
across platforms/versions).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace

from portachat.data.synthetic.common import WORDS, Example
from portachat.data.synthetic.zh import TASKS_ZH
from portachat.i18n import _

# ----------------------------------------------------------------------------------------------
# small built-in tables


CAPITALS = {
    "France": "Paris", "Japan": "Tokyo", "Italy": "Rome", "Spain": "Madrid", "Germany": "Berlin",
    "Egypt": "Cairo", "Canada": "Ottawa", "Russia": "Moscow", "China": "Beijing", "India": "New Delhi",
    "Kenya": "Nairobi", "Peru": "Lima", "Greece": "Athens", "Norway": "Oslo", "Portugal": "Lisbon",
    "Ireland": "Dublin", "Austria": "Vienna", "Poland": "Warsaw", "Mexico": "Mexico City",
    "Argentina": "Buenos Aires", "Australia": "Canberra", "Brazil": "Brasilia", "Sweden": "Stockholm",
    "Thailand": "Bangkok", "Turkey": "Ankara", "Cuba": "Havana", "Chile": "Santiago",
}
COLORS = {
    "the sky on a clear day": "blue", "grass": "green", "a ripe banana": "yellow", "snow": "white",
    "coal": "black", "a ripe tomato": "red", "an orange": "orange", "a lemon": "yellow",
    "a lime": "green", "milk": "white", "a crow": "black", "a strawberry": "red", "chocolate": "brown",
    "an eggplant": "purple", "the sea": "blue", "a pumpkin": "orange", "a polar bear": "white",
}
ANIMAL_SOUNDS = {
    "cow": "moo", "dog": "woof", "cat": "meow", "duck": "quack", "sheep": "baa", "pig": "oink",
    "horse": "neigh", "owl": "hoot", "lion": "roar", "snake": "hiss", "frog": "croak", "bee": "buzz",
    "mouse": "squeak", "rooster": "cock-a-doodle-doo", "donkey": "hee-haw",
}
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
    "November", "December",
)
NAMES = ("Tom", "Anna", "Sam", "Lily", "Ben", "Mia", "Leo", "Emma", "Max", "Zoe", "Noah", "Ava")
THINGS = ("apples", "books", "marbles", "coins", "pencils", "stickers", "cookies", "flowers", "shells", "cards")

_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen"
).split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def number_to_words(n: int) -> str:
    """English words for 0 <= n < 1,000,000 (e.g. 342 -> 'three hundred forty-two')."""
    if not 0 <= n < 1_000_000:
        raise ValueError(f"number_to_words handles 0..999999, got {n}")
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else "-" + _ONES[n % 10])
    if n < 1000:
        rest = n % 100
        return _ONES[n // 100] + " hundred" + ("" if rest == 0 else " " + number_to_words(rest))
    rest = n % 1000
    return number_to_words(n // 1000) + " thousand" + ("" if rest == 0 else " " + number_to_words(rest))


# ----------------------------------------------------------------------------------------------
# task generators: rng -> Example


def arithmetic(rng: random.Random) -> Example:
    kind = rng.choice(("add", "sub", "mul", "chain", "words", "story"))
    if kind == "add":
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        q, ans, expr = f"What is {a} + {b}?", a + b, f"{a} + {b}"
    elif kind == "sub":
        a = rng.randint(0, 99)
        b = rng.randint(0, a)
        q, ans, expr = f"What is {a} - {b}?", a - b, f"{a} - {b}"
    elif kind == "mul":
        a, b = rng.randint(0, 12), rng.randint(0, 12)
        q, ans, expr = f"What is {a} * {b}?", a * b, f"{a} * {b}"
    elif kind == "chain":
        a, b, c = rng.randint(1, 20), rng.randint(1, 20), rng.randint(1, 9)
        form, ans = rng.choice(
            (("{a} + {b} + {c}", a + b + c), ("{a} + {b} - {c}", a + b - c),
             ("({a} + {b}) * {c}", (a + b) * c), ("{a} * {c} + {b}", a * c + b))
        )
        expr = form.format(a=a, b=b, c=c)
        q = f"What is {expr}?"
    elif kind == "words":
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        op = rng.choice(("plus", "times"))
        ans = a + b if op == "plus" else a * b
        expr = f"{number_to_words(a)} {op} {number_to_words(b)}"
        q = f"What is {expr}?"
        return Example("arithmetic", q, number_to_words(ans), f"{expr.capitalize()} is {number_to_words(ans)}.")
    else:
        name, thing = rng.choice(NAMES), rng.choice(THINGS)
        a, b = rng.randint(1, 15), rng.randint(1, 15)
        if rng.random() < 0.5:
            q = f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?"
            ans = a + b
            stmt = f"{name} had {a} {thing}, got {b} more, and now has {ans} {thing}."
        else:
            a, b = max(a, b), min(a, b)
            q = f"{name} has {a} {thing} and gives away {b}. How many {thing} does {name} have left?"
            ans = a - b
            stmt = f"{name} had {a} {thing}, gave away {b}, and has {ans} {thing} left."
        return Example("arithmetic", q, str(ans), stmt)
    return Example("arithmetic", q, str(ans), f"{expr} = {ans}")


def counting(rng: random.Random) -> Example:
    kind = rng.choice(("letters", "occurrences", "items"))
    if kind == "letters":
        word = rng.choice(WORDS)
        n = len(word)
        return Example("counting", f"How many letters are in the word {word}?", str(n),
                       f"The word {word} has {n} letters.")
    if kind == "occurrences":
        word = rng.choice(WORDS)
        letter = rng.choice(word) if rng.random() < 0.8 else rng.choice("abcdefghijklmnopqrstuvwxyz")
        n = word.count(letter)
        times = "time" if n == 1 else "times"
        return Example("counting", f"How many times does the letter {letter} appear in {word}?", str(n),
                       f"The letter {letter} appears {n} {times} in {word}.")
    items = rng.sample(WORDS, rng.randint(1, 8))
    listing = ", ".join(items)
    n = len(items)
    return Example("counting", f"How many items are in this list: {listing}?", str(n),
                   f"The list {listing} has {n} item{'s' if n != 1 else ''}.")


def spelling(rng: random.Random) -> Example:
    word = rng.choice(WORDS)
    kind = rng.choice(("spell", "first", "last", "reverse"))
    if kind == "spell":
        spelled = "-".join(word)
        return Example("spelling", f"How do you spell {word}?", spelled, f"{word} is spelled {spelled}.")
    if kind == "first":
        return Example("spelling", f"What is the first letter of {word}?", word[0],
                       f"The first letter of {word} is {word[0]}.")
    if kind == "last":
        return Example("spelling", f"What is the last letter of {word}?", word[-1],
                       f"The last letter of {word} is {word[-1]}.")
    return Example("spelling", f"What is {word} spelled backwards?", word[::-1],
                   f"{word} spelled backwards is {word[::-1]}.")


def comparison(rng: random.Random) -> Example:
    kind = rng.choice(("larger", "smaller", "yesno", "max", "min"))
    if kind in ("larger", "smaller"):
        a, b = rng.sample(range(0, 100), 2)
        ans = max(a, b) if kind == "larger" else min(a, b)
        other = b if ans == a else a
        rel = "larger" if kind == "larger" else "smaller"
        return Example("comparison", f"Which is {rel}, {a} or {b}?", str(ans), f"{ans} is {rel} than {other}.")
    if kind == "yesno":
        a, b = rng.sample(range(0, 100), 2)
        rel = rng.choice(("less", "greater"))
        truth = a < b if rel == "less" else a > b
        stmt = f"{a} is {rel} than {b}." if truth else f"{a} is not {rel} than {b}."
        return Example("comparison", f"Is {a} {rel} than {b}?", "yes" if truth else "no", stmt)
    nums = rng.sample(range(0, 100), rng.randint(3, 5))
    listing = ", ".join(map(str, nums))
    if kind == "max":
        return Example("comparison", f"What is the largest number in {listing}?", str(max(nums)),
                       f"The largest of {listing} is {max(nums)}.")
    return Example("comparison", f"What is the smallest number in {listing}?", str(min(nums)),
                   f"The smallest of {listing} is {min(nums)}.")


def facts(rng: random.Random) -> Example:
    kind = rng.choice(("capital", "color", "sound", "day_after", "day_before", "month_after"))
    if kind == "capital":
        country, city = rng.choice(sorted(CAPITALS.items()))
        return Example("facts", f"What is the capital of {country}?", city, f"The capital of {country} is {city}.")
    if kind == "color":
        thing, color = rng.choice(sorted(COLORS.items()))
        return Example("facts", f"What color is {thing}?", color, f"The color of {thing} is {color}.")
    if kind == "sound":
        animal, sound = rng.choice(sorted(ANIMAL_SOUNDS.items()))
        return Example("facts", f"What sound does a {animal} make?", sound, f"A {animal} says {sound}.")
    if kind == "day_after":
        i = rng.randrange(7)
        return Example("facts", f"What day comes after {DAYS[i]}?", DAYS[(i + 1) % 7],
                       f"The day after {DAYS[i]} is {DAYS[(i + 1) % 7]}.")
    if kind == "day_before":
        i = rng.randrange(7)
        return Example("facts", f"What day comes before {DAYS[i]}?", DAYS[i - 1],
                       f"The day before {DAYS[i]} is {DAYS[i - 1]}.")
    i = rng.randrange(12)
    return Example("facts", f"What month comes after {MONTHS[i]}?", MONTHS[(i + 1) % 12],
                   f"The month after {MONTHS[i]} is {MONTHS[(i + 1) % 12]}.")


TASKS: dict[str, Callable[[random.Random], Example]] = {
    "arithmetic": arithmetic,
    "counting": counting,
    "spelling": spelling,
    "comparison": comparison,
    "facts": facts,
}


def _task_table(lang: str) -> dict[str, Callable[[random.Random], Example]]:
    if lang == "en":
        return TASKS
    if lang == "zh":
        return TASKS_ZH
    raise ValueError(f"lang must be 'en' or 'zh', got {lang!r}")


def _draw(rng: random.Random, name: str, lang: str) -> Example:
    ex = _task_table(lang)[name](rng)
    return ex if lang == "en" else replace(ex, lang=lang)


def synthetic_examples(n: int, seed: int | str = 0, tasks: tuple[str, ...] | None = None,
                       lang: str = "en") -> list[Example]:
    """n examples in `lang` ("en" or "zh") drawn evenly at random from `tasks` (default: all),
    deterministic in `seed`."""
    names = tuple(tasks) if tasks is not None else tuple(TASKS)
    unknown = [t for t in names if t not in TASKS]
    if unknown:
        raise ValueError(_("unknown synthetic task(s) {unknown}; known: {known}").format(
            unknown=", ".join(unknown), known=", ".join(sorted(TASKS))))
    _task_table(lang)
    rng = random.Random(f"portachat-synthetic:{seed}")
    return [_draw(rng, rng.choice(names), lang) for _ in range(n)]


def synthetic_qa(n: int, seed: int | str = 0) -> list[tuple[str, str]]:
    """n (question, answer) pairs from all tasks."""
    return [(ex.question, ex.answer) for ex in synthetic_examples(n, seed)]


# ----------------------------------------------------------------------------------------------
# documents

_QA_TEMPLATES = (
    "Question: {q}\nAnswer: {a}",
    "Q: {q}\nA: {a}",
    "{q} {a}.",
    "{q}\nThe answer is {a}.",
)
