from __future__ import annotations

from pathlib import Path

import pytest

from portachat.tokenizer import Tokenizer, train_tokenizer

SHAKESPEARE = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "tinyshakespeare.txt"


@pytest.fixture(scope="session")
def shakespeare() -> str:
    if not SHAKESPEARE.is_file():
        pytest.skip(f"reference data missing: {SHAKESPEARE}")
    return SHAKESPEARE.read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def held_out(shakespeare: str) -> list[str]:
    """Text the tokenizer never saw (training uses the first 200k chars)."""
    return [d for d in shakespeare[900_000:1_000_000].split("\n\n") if d]


@pytest.fixture(scope="session")
def tok(shakespeare: str) -> Tokenizer:
    docs = [d for d in shakespeare[:200_000].split("\n\n") if d]
    return train_tokenizer(docs, vocab_size=512, verbose=False)
