"""Shared fixtures: tiny real parts (a trained tokenizer, a small model) made inside the tests."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shakespeare_path() -> Path:
    path = SHARED_DATA / "tinyshakespeare.txt"
    if not path.is_file():
        pytest.skip(f"reference data not found at {path}")
    return path


@pytest.fixture(scope="session")
def small_tokenizer(shakespeare_path):
    from portachat.tokenizer import train_tokenizer

    text = shakespeare_path.read_text(encoding="utf-8")[:100_000]
    return train_tokenizer(text.split("\n\n"), vocab_size=384)


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    """Nothing a test does touches the user's ~/.cache/portachat."""
    monkeypatch.setenv("PORTACHAT_HOME", str(tmp_path / "home"))
