from __future__ import annotations

import pytest

from portachat.tokenizer import ChatFormatError, Tokenizer, render_conversation, render_for_completion

PLAIN = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "It is 4."},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "6."},
]


def trained_text(tok: Tokenizer, ids: list[int], mask: list[int]) -> str:
    return tok.decode([i for i, m in zip(ids, mask, strict=True) if m])


def test_layout_and_mask(tok: Tokenizer) -> None:
    ids, mask = render_conversation(tok, PLAIN)
    assert len(ids) == len(mask)
    s = tok.special_ids
    expected = [
        tok.bos_id,
        s["<|user_start|>"], *tok.encode("What is 2+2?"), s["<|user_end|>"],
        s["<|assistant_start|>"], *tok.encode("It is 4."), s["<|assistant_end|>"],
        s["<|user_start|>"], *tok.encode("And 3+3?"), s["<|user_end|>"],
        s["<|assistant_start|>"], *tok.encode("6."), s["<|assistant_end|>"],
    ]  # fmt: skip
    assert ids == expected
    assert tok.decode(ids) == (
        "<|bos|><|user_start|>What is 2+2?<|user_end|><|assistant_start|>It is 4.<|assistant_end|>"
        "<|user_start|>And 3+3?<|user_end|><|assistant_start|>6.<|assistant_end|>"
    )
    # Trained on exactly the assistant replies and their closing token; never on user text or openers.
    assert trained_text(tok, ids, mask) == "It is 4.<|assistant_end|>6.<|assistant_end|>"
    assert mask[0] == 0
    for i, token_id in enumerate(ids):
        if token_id in (s["<|user_start|>"], s["<|user_end|>"], s["<|assistant_start|>"]):
            assert mask[i] == 0
        if token_id == s["<|assistant_end|>"]:
            assert mask[i] == 1


def test_system_merged_into_first_user(tok: Tokenizer) -> None:
    with_system = [{"role": "system", "content": "Be brief."}, *PLAIN]
    merged = [{"role": "user", "content": "Be brief.\n\nWhat is 2+2?"}, *PLAIN[1:]]
    assert render_conversation(tok, with_system) == render_conversation(tok, merged)
    original = [dict(m) for m in with_system]
    render_conversation(tok, with_system)
    assert with_system == original  # the caller's messages are not modified


def test_tool_parts_mask(tok: Tokenizer) -> None:
    messages = [
        {"role": "user", "content": "What is 12*34?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me compute. "},
                {"type": "python", "text": "12*34"},
                {"type": "python_output", "text": "408"},
                {"type": "text", "text": " The answer is 408."},
            ],
        },
    ]
    ids, mask = render_conversation(tok, messages)
    assert tok.decode(ids).endswith(
        "<|assistant_start|>Let me compute. <|python_start|>12*34<|python_end|>"
        "<|output_start|>408<|output_end|> The answer is 408.<|assistant_end|>"
    )
    # The model learns to write the call, not the tool's output.
    assert trained_text(tok, ids, mask) == (
        "Let me compute. <|python_start|>12*34<|python_end|> The answer is 408.<|assistant_end|>"
    )


def test_max_tokens_truncates_both(tok: Tokenizer) -> None:
    ids, mask = render_conversation(tok, PLAIN)
    short_ids, short_mask = render_conversation(tok, PLAIN, max_tokens=7)
    assert (short_ids, short_mask) == (ids[:7], mask[:7])
    with pytest.raises(ChatFormatError, match="max_tokens"):
        render_conversation(tok, PLAIN, max_tokens=0)


def test_render_for_completion(tok: Tokenizer) -> None:
    prompt = render_for_completion(tok, PLAIN)  # trailing assistant reply dropped
    ids, _ = render_conversation(tok, PLAIN[:3])
    assert prompt == [*ids, tok.special_ids["<|assistant_start|>"]]
    assert render_for_completion(tok, PLAIN[:3]) == prompt  # already ends with the user
    assert render_for_completion(tok, {"messages": PLAIN}) == prompt


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ([], "non-empty"),
        ("hello", "non-empty"),
        ([{"role": "assistant", "content": "hi"}], "expected role 'user'"),
        ([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "alternate"),
        ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "system", "content": "c"}],
         "expected role 'user'"),
        ([{"role": "system", "content": "s"}], "followed by a user"),
        ([{"role": "user"}], "'role' and 'content'"),
        ([{"role": "user", "content": 5}], "string or a list of parts"),
        ([{"role": "user", "content": [{"type": "python", "text": "1+1"}]}], "not allowed"),
        ([{"role": "user", "content": "q"}, {"role": "assistant", "content": [{"type": "image", "text": "x"}]}],
         "not allowed"),
        ([{"role": "user", "content": "q"}, {"role": "assistant", "content": [{"type": "text"}]}], "part 0"),
    ],
)  # fmt: skip
def test_bad_conversations(tok: Tokenizer, messages, match: str) -> None:
    with pytest.raises(ChatFormatError, match=match):
        render_conversation(tok, messages)
    with pytest.raises(ValueError):  # ChatFormatError is a ValueError
        render_for_completion(tok, messages)


def test_user_text_parts_are_joined(tok: Tokenizer) -> None:
    parts = [
        {"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]}
    ]
    assert render_conversation(tok, parts) == render_conversation(
        tok, [{"role": "user", "content": "Hello there"}]
    )
