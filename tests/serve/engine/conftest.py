from __future__ import annotations

import pytest
from engine_testing import OurChatTokenizer


@pytest.fixture(scope="session")
def chat_tokenizer(small_tokenizer) -> OurChatTokenizer:
    return OurChatTokenizer(small_tokenizer)
