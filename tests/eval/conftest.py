from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import require_shared


@pytest.fixture(scope="session")
def humaneval_path() -> Path:
    return require_shared("humaneval.jsonl.gz")


@pytest.fixture(scope="session")
def gsm8k_test_path() -> Path:
    return require_shared("gsm8k/test.jsonl")
