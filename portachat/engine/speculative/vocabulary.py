"""A draft model must speak the target's token ids: the same vocabulary, token for token."""

from __future__ import annotations

from portachat.model.gpt import GPT
from portachat.tokenizer.protocol import ChatTokenizer


def check_same_vocabulary(target: GPT, target_tokenizer: ChatTokenizer, draft: GPT, draft_tokenizer: ChatTokenizer,
                          draft_name: str) -> None:  # fmt: skip
    """Raise ValueError naming the first difference between the two vocabularies."""
    problem = None
    if draft.config.vocab_size != target.config.vocab_size:
        problem = f"its embedding has {draft.config.vocab_size} rows, the target's {target.config.vocab_size}"
    elif draft_tokenizer.vocab_size != target_tokenizer.vocab_size:
        problem = f"its tokenizer has {draft_tokenizer.vocab_size} tokens, the target's {target_tokenizer.vocab_size}"
    else:
        for i in range(target_tokenizer.vocab_size):
            a, b = target_tokenizer.token_bytes(i), draft_tokenizer.token_bytes(i)
            if a != b:
                problem = f"token {i} is {b!r} in the draft and {a!r} in the target"
                break
    if problem is not None:
        raise ValueError(
            f"--speculative-model {draft_name} does not share the target model's vocabulary ({problem}); "
            "use a draft from the same model family and tokenizer, or --speculative-model ngram"
        )
