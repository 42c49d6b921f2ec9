from __future__ import annotations

import pytest
import torch
from engine_testing import OurChatTokenizer


@pytest.fixture(scope="session")
def chat_tokenizer(small_tokenizer) -> OurChatTokenizer:
    return OurChatTokenizer(small_tokenizer)


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models gain nothing from threads, and on a shared machine thread-pool stalls make them
    10x slower; the setting is restored for whatever runs next in this process."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
