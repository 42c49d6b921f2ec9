"""What both languages of the curriculum share: the example type and the English words that spelling
and letter-counting questions use in either language."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Example:
    task: str
    question: str
    answer: str
    statement: str  # the question and answer as one declarative sentence
    lang: str = "en"  # "en" or "zh" (zh.py's generators)


WORDS = (
    "apple banana cherry grape lemon mango orange peach pear plum melon berry bread butter cheese "
    "water milk honey sugar salt pepper rice pasta soup cake cookie candy table chair window door house "
    "garden flower tree river mountain ocean island forest desert cloud rain snow storm thunder sun moon "
    "star planet rocket engine train plane boat bicycle wheel road bridge city village school teacher "
    "student book paper pencil letter number circle square triangle music piano guitar drum song dance "
    "kitten puppy rabbit turtle monkey tiger zebra giraffe elephant dolphin penguin parrot spider bottle "
    "basket blanket pillow mirror button pocket jacket shoe sock hat glove yellow purple silver golden "
    "happy little quick bright quiet gentle simple strong"
).split()
