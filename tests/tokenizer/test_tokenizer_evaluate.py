from __future__ import annotations

import pytest

from portachat.tokenizer import Tokenizer, TokenizerConfigError, evaluate_tokenizer, format_evaluation


def test_held_out_compression_and_speed(tok: Tokenizer, held_out: list[str]) -> None:
    result = evaluate_tokenizer(tok, held_out)
    assert result["bytes_per_token"] > 1.5
    assert result["bytes"] == sum(len(t.encode()) for t in held_out)
    assert result["tokens"] == sum(len(ids) for ids in tok.encode_batch(held_out))
    assert result["bytes_per_token"] == pytest.approx(result["bytes"] / result["tokens"])
    assert result["tokens_per_byte"] == pytest.approx(1 / result["bytes_per_token"])
    assert result["encode_tokens_per_s"] > 0 and result["encode_mb_per_s"] > 0
    assert result["encode_mb_per_s"] == pytest.approx(result["bytes"] / result["encode_seconds"] / 1e6)
    assert result["roundtrip_ok"] is True
    text = format_evaluation(result)
    assert f"bytes/token {result['bytes_per_token']:.3f}" in text and "round trip: ok" in text


def test_untrained_text_compresses_worse(tok: Tokenizer, held_out: list[str]) -> None:
    # Shakespeare merges do little for Chinese text: bytes/token must fall well below the held-out value.
    english = evaluate_tokenizer(tok, held_out)["bytes_per_token"]
    chinese = evaluate_tokenizer(tok, ["中文字符和日本語のテキスト" * 20])["bytes_per_token"]
    assert chinese < english - 0.5


def test_empty_eval_rejected(tok: Tokenizer) -> None:
    with pytest.raises(TokenizerConfigError, match="no evaluation text"):
        evaluate_tokenizer(tok, ["", ""])
