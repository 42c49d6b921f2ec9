"""Two models must speak the same token ids (a draft and its target, a student and its teacher): the
same vocabulary, token for token."""

from __future__ import annotations

from dataclasses import dataclass

from portachat.i18n import _
from portachat.model.gpt import GPT
from portachat.tokenizer.protocol import ChatTokenizer


@dataclass(frozen=True)
class VocabularyDifference:
    """The first difference found between vocabularies a and b."""

    rows: tuple[int, int]  # embedding rows of a and b
    tokens: tuple[int, int]  # tokenizer sizes of a and b
    token_id: int | None = None  # the first id the two spell differently (same sizes)
    spellings: tuple[bytes, bytes] | None = None


def vocabulary_difference(a: GPT, a_tokenizer: ChatTokenizer, b: GPT, b_tokenizer: ChatTokenizer
                          ) -> VocabularyDifference | None:  # fmt: skip
    """None when a and b share their vocabulary token for token."""
    found = VocabularyDifference((a.config.vocab_size, b.config.vocab_size), (a_tokenizer.vocab_size, b_tokenizer.vocab_size))
    if found.rows[0] != found.rows[1] or found.tokens[0] != found.tokens[1]:
        return found
    for i in range(a_tokenizer.vocab_size):
        x, y = a_tokenizer.token_bytes(i), b_tokenizer.token_bytes(i)
        if x != y:
            return VocabularyDifference(found.rows, found.tokens, i, (x, y))
    return None


def check_same_vocabulary(target: GPT, target_tokenizer: ChatTokenizer, draft: GPT, draft_tokenizer: ChatTokenizer,
                          draft_name: str) -> None:  # fmt: skip
    """Raise ValueError naming the first difference between the two vocabularies."""
    found = vocabulary_difference(target, target_tokenizer, draft, draft_tokenizer)
    if found is None:
        return
    if found.rows[0] != found.rows[1]:
        problem = _("its embedding has {draft} rows, the target's {target}").format(
            draft=found.rows[1], target=found.rows[0])
    elif found.tokens[0] != found.tokens[1]:
        problem = _("its tokenizer has {draft} tokens, the target's {target}").format(
            draft=found.tokens[1], target=found.tokens[0])
    else:
        problem = _("token {id} is {draft} in the draft and {target} in the target").format(
            id=found.token_id, draft=repr(found.spellings[1]), target=repr(found.spellings[0]))
    raise ValueError(_(
        "--speculative-model {draft} does not share the target model's vocabulary ({problem}); "
        "use a draft from the same model family and tokenizer, or --speculative-model ngram").format(
            draft=draft_name, problem=problem))
