"""The default split pattern is one llama.cpp knows by name, so GGUF exports tokenize as we do."""

from __future__ import annotations

import re

from export_testing import LEGACY_SPLIT_PATTERN
from tokenizers import Regex, pre_tokenizers

from portachat.tokenizer import Tokenizer, train_tokenizer
from portachat.tokenizer.bpe import PRE_TOKENIZER_NAME, SPLIT_PATTERN


def test_default_pattern_is_qwen2_and_equals_transformers_gguf_table():
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS

    assert PRE_TOKENIZER_NAME == "qwen2"
    assert GGUF_PRE_TOKENIZER_SPLITS[PRE_TOKENIZER_NAME] == SPLIT_PATTERN


def test_numbers_split_into_single_digits(tmp_path):
    docs = [f"in {1000 + i} there were {i * 137 % 100000} ships and {i * 7919} men" for i in range(600)]
    tok = train_tokenizer(docs, vocab_size=400, verbose=False)
    longest = max(len(m) for i in range(tok.vocab_size) for m in re.findall(r"\d+", tok.decode([i])) or [""])
    assert longest == 1
    assert tok.pre_tokenizer_name() == "qwen2" and tok.split_pattern() == SPLIT_PATTERN
    tok.save(tmp_path)
    assert Tokenizer.load(tmp_path).pre_tokenizer_name() == "qwen2"
    assert '"portachat_pre_tokenizer": "qwen2"' in (tmp_path / "tokenizer_config.json").read_text()


def test_tokenizers_saved_with_the_old_pattern_still_load_but_have_no_llama_cpp_name(tmp_path, small_tokenizer):
    state = small_tokenizer._hf.to_str()
    old = small_tokenizer._hf.__class__.from_str(state)
    old.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(pattern=Regex(LEGACY_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    legacy = Tokenizer(old)
    legacy.save(tmp_path)
    loaded = Tokenizer.load(tmp_path)
    assert loaded.split_pattern() == LEGACY_SPLIT_PATTERN and loaded.pre_tokenizer_name() is None
    assert loaded.encode("year 2024") == legacy.encode("year 2024")
