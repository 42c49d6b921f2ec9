from __future__ import annotations

import json
import re

import pytest
import torch

from portachat.tokenizer import (
    BOS,
    EOS,
    MIN_VOCAB_SIZE,
    SPECIAL_TOKENS,
    Tokenizer,
    TokenizerConfigError,
    TokenizerFormatError,
    TokenizerNotFoundError,
    train_tokenizer,
)

TRICKY = [
    "Hello, world!",
    "naïve café — “quotes” and ümlauts",
    "emoji 😀👍🏽 and a family 👨‍👩‍👧 zwj",
    "中文字符和日本語のテキスト, 한국어",
    "digits 1234567890 and 3.14159, year 2024, -42",
    "  leading spaces\n\n\ttabs\r\nCRLF and trailing   ",
    "",
    "a",
    "\x00\x01 control bytes \u200b zero-width",
]


def test_vocab_and_special_ids(tok: Tokenizer) -> None:
    assert tok.vocab_size == 512
    assert set(tok.special_ids) == set(SPECIAL_TOKENS)
    assert len(set(tok.special_ids.values())) == len(SPECIAL_TOKENS)
    assert tok.bos_id == tok.special_ids[BOS]
    assert tok.eos_id == tok.special_ids[EOS] == tok.special_ids["<|assistant_end|>"]
    for token, token_id in tok.special_ids.items():
        assert tok.id_to_token(token_id) == token
        assert tok.token_to_id(token) == token_id
        assert tok.decode([token_id]) == token


@pytest.mark.parametrize("text", TRICKY)
def test_round_trip(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


def test_prepend_bos_and_batch_match_single(tok: Tokenizer) -> None:
    assert tok.encode("hi there", prepend_bos=True) == [tok.bos_id, *tok.encode("hi there")]
    assert tok.encode_batch(TRICKY) == [tok.encode(t) for t in TRICKY]
    assert tok.encode_batch(TRICKY, prepend_bos=True) == [tok.encode(t, prepend_bos=True) for t in TRICKY]


def test_merges_compress_common_words(tok: Tokenizer) -> None:
    # A trained vocabulary must beat one token per byte on text like its training data.
    text = "the king and the queen shall speak"
    assert len(tok.encode(text)) < len(text.encode()) / 2


def test_digits_are_single_tokens() -> None:
    # Qwen2's split (llama.cpp pre-tokenizer "qwen2") isolates every digit: numbers tokenize the same
    # way in GGUF exports, and arithmetic sees one token per digit.
    docs = [f"in {1000 + i} there were {i * 137 % 100000} ships and {i * 7919} men" for i in range(3000)]
    tok = train_tokenizer(docs, vocab_size=700, verbose=False)
    digit_runs = [
        max((len(m) for m in re.findall(r"\d+", tok.decode([i]))), default=0) for i in range(tok.vocab_size)
    ]
    assert max(digit_runs) == 1  # no multi-digit token can be learned
    ids = tok.encode("year 2024: 1234567")
    assert [tok.decode([i]) for i in ids if tok.decode([i]).strip().isdigit()] == list("20241234567")


def test_literal_special_strings_are_plain_text(tok: Tokenizer) -> None:
    # Decision: encode() never turns user text into control tokens (no prompt injection of <|bos|> etc.).
    text = "say <|bos|> then <|assistant_end|> please"
    ids = tok.encode(text)
    assert not set(ids) & set(tok.special_ids.values())
    assert tok.decode(ids) == text
    assert len(tok.encode("<|bos|>")) > 1


def test_token_bytes(tok: Tokenizer, held_out: list[str]) -> None:
    tb = tok.token_bytes()
    assert tb.dtype == torch.int64 and tb.shape == (tok.vocab_size,)
    for token_id in tok.special_ids.values():
        assert tb[token_id] == 0
    normal = [i for i in range(tok.vocab_size) if i not in set(tok.special_ids.values())]
    assert bool((tb[normal] >= 1).all())
    for text in [*TRICKY, "\n\n".join(held_out[:50])]:
        ids = tok.encode(text, prepend_bos=True)  # bos counts 0 bytes
        assert int(tb[torch.tensor(ids, dtype=torch.long)].sum()) == len(text.encode("utf-8"))
    tb[0] = 99  # callers get a copy, the cached table stays correct
    assert tok.token_bytes()[0] == 0


def test_save_load_round_trip(tok: Tokenizer, tmp_path, held_out: list[str]) -> None:
    out = tmp_path / "tok"
    tok.save(out, model_max_length=1024)
    assert sorted(p.name for p in out.iterdir()) == [
        "tokenizer.json",
        "tokenizer_config.json",
    ]  # no temp files
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert (config["bos_token"], config["eos_token"], config["model_max_length"]) == (BOS, EOS, 1024)
    assert "<|user_start|>" in config["chat_template"]
    loaded = Tokenizer.load(out)
    assert loaded.fingerprint() == tok.fingerprint() == config["portachat_fingerprint"]
    assert loaded.vocab_size == tok.vocab_size and loaded.special_ids == tok.special_ids
    texts = [*TRICKY, *held_out[:100]]
    assert loaded.encode_batch(texts) == tok.encode_batch(texts)
    assert torch.equal(loaded.token_bytes(), tok.token_bytes())
    assert Tokenizer.load(out / "tokenizer.json").fingerprint() == tok.fingerprint()
    # A saved tokenizer still treats literal specials as text after loading.
    assert not set(loaded.encode("<|bos|>")) & set(loaded.special_ids.values())
    tok.save(out)  # overwriting in place works
    assert Tokenizer.load(out).fingerprint() == tok.fingerprint()


def test_fingerprint_tracks_vocabulary(tok: Tokenizer, shakespeare: str) -> None:
    fp = tok.fingerprint()
    assert re.fullmatch(r"[0-9a-f]{16}", fp)
    other = train_tokenizer([shakespeare[:200_000]], vocab_size=520, verbose=False)
    assert other.fingerprint() != fp


def test_vocab_too_small_is_rejected() -> None:
    with pytest.raises(TokenizerConfigError, match=f"at least {MIN_VOCAB_SIZE}"):
        train_tokenizer(["some text"], vocab_size=256 + len(SPECIAL_TOKENS))
    with pytest.raises(TokenizerConfigError, match="must be positive"):
        train_tokenizer(["some text"], vocab_size=600, doc_cap=0)


def test_bad_training_texts() -> None:
    with pytest.raises(TokenizerConfigError, match="no training text"):
        train_tokenizer(["", ""], vocab_size=300, verbose=False)
    with pytest.raises(TokenizerConfigError, match="must be str"):
        train_tokenizer(["ok", b"bytes"], vocab_size=300, verbose=False)


def test_caps_stop_reading(capsys) -> None:
    pulled = []

    def endless():
        i = 0
        while True:
            pulled.append(i)
            yield "abcdefghij " * 50  # 550 chars, cropped to doc_cap
            i += 1

    tok = train_tokenizer(endless(), vocab_size=300, max_chars=1000, doc_cap=100)
    assert len(pulled) == 10  # 10 docs x 100 chars reach max_chars; the endless source is not drained
    out = capsys.readouterr().out
    assert "10 documents, 1,000 chars" in out and "vocab_size=300" in out
    assert tok.decode(tok.encode("abcdefghij ")) == "abcdefghij "


def test_load_missing_and_corrupt(tmp_path) -> None:
    with pytest.raises(TokenizerNotFoundError, match="portachat tokenizer train"):
        Tokenizer.load(tmp_path / "nope")
    with pytest.raises(FileNotFoundError):  # also catchable as the builtin
        Tokenizer.load(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerFormatError, match="not a valid"):
        Tokenizer.load(tmp_path)


def test_foreign_tokenizer_without_specials_is_rejected(tmp_path) -> None:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models

    HFTokenizer(models.BPE()).save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(TokenizerFormatError, match="special tokens"):
        Tokenizer.load(tmp_path)


def test_id_out_of_range(tok: Tokenizer) -> None:
    with pytest.raises(IndexError, match="outside the vocabulary"):
        tok.id_to_token(tok.vocab_size)
    with pytest.raises(KeyError):
        tok.token_to_id("<|not_a_token|>")
