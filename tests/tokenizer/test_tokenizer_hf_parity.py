"""The saved directory is a Hugging Face tokenizer: AutoTokenizer gives our ids, chat template included."""

from __future__ import annotations

import pytest

from portachat.tokenizer import Tokenizer, render_conversation, render_for_completion

transformers = pytest.importorskip("transformers")

CONVERSATIONS = [
    [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello, how can I help?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Count: 1 2 3 12345 😀"},
        {"role": "assistant", "content": "4 5 6\n\nDone."},
        {"role": "user", "content": "  spaces  and\ttabs "},
        {"role": "assistant", "content": "ok"},
    ],
    [
        {"role": "user", "content": "What is 12*34?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Computing "},
                {"type": "python", "text": "12*34"},
                {"type": "python_output", "text": "408"},
                {"type": "text", "text": " so 408."},
            ],
        },
    ],
]


def input_ids(result) -> list[int]:
    # transformers 5 returns a BatchEncoding from apply_chat_template(tokenize=True); 4.x a list.
    return list(result["input_ids"]) if hasattr(result, "keys") else list(result)


@pytest.fixture(scope="module")
def hf(tok: Tokenizer, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf_tok")
    tok.save(out)
    return transformers.AutoTokenizer.from_pretrained(str(out), local_files_only=True)


def test_special_ids(hf, tok: Tokenizer) -> None:
    assert hf.bos_token_id == tok.bos_id
    assert hf.eos_token_id == tok.eos_id
    assert hf.pad_token_id is not None
    assert len(hf) == tok.vocab_size
    assert hf.model_max_length == 2048


def test_plain_text_parity(hf, tok: Tokenizer, held_out: list[str]) -> None:
    texts = [*held_out[:200], "emoji 😀 digits 1234567 ünïcode 中文"]
    assert [hf(t, add_special_tokens=False)["input_ids"] for t in texts] == tok.encode_batch(texts)
    assert hf.decode(tok.encode(texts[-1])) == texts[-1]


@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
def test_chat_template_parity(hf, tok: Tokenizer, index: int) -> None:
    messages = CONVERSATIONS[index]
    ids, _ = render_conversation(tok, messages)
    assert hf.apply_chat_template(messages, tokenize=False) == tok.decode(ids)
    assert input_ids(hf.apply_chat_template(messages, tokenize=True)) == ids


@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
def test_generation_prompt_parity(hf, tok: Tokenizer, index: int) -> None:
    messages = CONVERSATIONS[index]
    prompt = render_for_completion(tok, messages)
    hf_ids = input_ids(hf.apply_chat_template(messages[:-1], tokenize=True, add_generation_prompt=True))
    assert hf_ids == prompt
    assert tok.decode(prompt).endswith("<|user_end|><|assistant_start|>")


def test_skip_special_tokens(hf, tok: Tokenizer) -> None:
    ids, _ = render_conversation(tok, CONVERSATIONS[0])
    assert hf.decode(ids, skip_special_tokens=True) == "Hi!Hello, how can I help?"
