"""The grammar library's view of a tokenizer, built from our ChatTokenizer protocol (the one place
that does it), so byte-level BPEs of existing models (HF `tokenizers`, GGUF-rebuilt) and our own
BPE all work the same way.

llguidance wants each token's bytes. Control tokens (empty in `token_bytes`) get a name the
grammar can never spell as text (`<[id]>`, llguidance's own syntax for a token id) and are marked
special; ids past the tokenizer but inside the model's (padded) vocabulary are empty and never
allowed. End-of-reply tokens are llguidance's EOS: allowed exactly where the grammar may end.
"""

from __future__ import annotations

from typing import Any

from portachat.tokenizer.protocol import ChatTokenizer


class _Wrapped:
    """The duck type llguidance.TokenizerWrapper reads (tokens, eos/bos ids, specials, encode)."""

    def __init__(self, tokenizer: ChatTokenizer, vocab_size: int) -> None:
        n = min(tokenizer.vocab_size, vocab_size)
        tokens = [tokenizer.token_bytes(i) for i in range(n)]
        self.special_token_ids = [i for i, b in enumerate(tokens) if not b]
        for i in self.special_token_ids:
            tokens[i] = f"<[{i}]>".encode()
        self.tokens = tokens + [b""] * (vocab_size - n)
        stops = sorted(tokenizer.stop_ids)
        self.eos_token_id = stops[0] if stops else None
        self.bos_token_id = tokenizer.bos_id
        self._tokenizer = tokenizer

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tokenizer.encode(text)


def ll_tokenizer(tokenizer: ChatTokenizer, vocab_size: int) -> Any:
    """An llguidance.LLTokenizer over `tokenizer`, its masks `vocab_size` wide (the model's logits)."""
    import llguidance  # deferred: optional package (constrained requests need it)

    wrapped = _Wrapped(tokenizer, vocab_size)
    stops = sorted(tokenizer.stop_ids)
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(wrapped), n_vocab=vocab_size, eos_token=stops or None)
