"""transformers' apply_chat_template on our saved tokenizer gives our renderer's ids for the
conversations the chat stages train on: synthetic tasks with tool calls, GSM8K, multiple choice."""

from __future__ import annotations

import pytest

from portachat.data.chat_data import row_to_conversation, synthetic_conversations
from portachat.tokenizer import Tokenizer, render_conversation, render_for_completion

transformers = pytest.importorskip("transformers")

CASES = [
    *[c["messages"] for c in synthetic_conversations(12, seed=7)],
    row_to_conversation({"question": "Tom has 3 boxes of 12. How many?", "answer": "3*12 = <<3*12=36>>36\n#### 36"})["messages"],
    row_to_conversation({"question": "2+2?", "choices": ["3", "4"], "answer": 1})["messages"],
    [  # adjacent text parts and a system prompt, several turns
        {"role": "system", "content": "Use the calculator."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo 12"},
                                          {"type": "text", "text": "34!"}]},
        {"role": "user", "content": [{"type": "text", "text": "and 7*6?"}]},
        {"role": "assistant", "content": [{"type": "python", "text": "7*6"}, {"type": "python_output", "text": "42"},
                                          {"type": "text", "text": "It is 42."}]},
    ],
]


def _ids(result) -> list[int]:
    return list(result["input_ids"]) if hasattr(result, "keys") else list(result)


@pytest.fixture(scope="module")
def hf(tok: Tokenizer, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf_chat_tok")
    tok.save(out)
    return transformers.AutoTokenizer.from_pretrained(str(out), local_files_only=True)


def test_apply_chat_template_gives_our_ids(hf, tok: Tokenizer) -> None:
    for messages in CASES:
        ids, _ = render_conversation(tok, messages)
        assert _ids(hf.apply_chat_template(messages, tokenize=True)) == ids, tok.decode(ids)
        prompt = render_for_completion(tok, messages)
        assert _ids(hf.apply_chat_template(messages[:-1], tokenize=True, add_generation_prompt=True)) == prompt


def test_adjacent_text_parts_encode_as_one_string(tok: Tokenizer) -> None:
    split = [{"role": "user", "content": "q"},
             {"role": "assistant", "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]}]
    joined = [split[0], {"role": "assistant", "content": "Hello"}]
    assert render_conversation(tok, split) == render_conversation(tok, joined)
