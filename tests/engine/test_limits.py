"""The one context check (engine/limits.py): the engine refuses with it, and the reply budget an
interface asks for ("the room the context leaves") follows the same rule."""

from __future__ import annotations

import pytest
from engine_testing import make_engine

from portachat.engine.limits import ContextLengthError, check_context, reply_budget
from portachat.engine.types import SamplingParams


def test_reply_budget_is_the_asked_length_or_the_room_left_capped():
    assert reply_budget(10, 5, 64) == 5
    assert reply_budget(10, None, 64) == 54 and reply_budget(10, None, 64, cap=16) == 16
    assert reply_budget(63, None, 64) == 1 and reply_budget(10, 54, 64) == 54
    with pytest.raises(ContextLengthError) as alone:
        reply_budget(64, None, 64)
    assert (alone.value.prompt_tokens, alone.value.max_tokens, alone.value.limit) == (64, None, 64)
    with pytest.raises(ContextLengthError) as both:
        reply_budget(10, 55, 64)
    assert (both.value.prompt_tokens, both.value.max_tokens, both.value.kind) == (10, 55, "too_long")
    assert "65 > the context window of 64 tokens" in str(both.value)


def test_the_engine_refuses_with_the_same_check(chat_tokenizer):
    engine = make_engine(chat_tokenizer, max_model_len=64)
    for prompt, max_tokens in ((60, 10), (64, 1), (70, 1)):
        with pytest.raises(ContextLengthError) as refused:
            engine.add_request(list(range(prompt)), SamplingParams(max_tokens=max_tokens))
        with pytest.raises(ContextLengthError) as checked:
            check_context(prompt, max_tokens, 64)
        assert str(refused.value) == str(checked.value)
    engine.add_request(list(range(60)), SamplingParams(max_tokens=4))  # exactly fills the window: admitted
