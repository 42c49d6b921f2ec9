"""Tokenizer quality and speed on held-out text: bytes per token and encode throughput."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from portachat.i18n import _
from portachat.tokenizer.errors import TokenizerConfigError

if TYPE_CHECKING:
    from portachat.tokenizer.bpe import Tokenizer


def evaluate_tokenizer(tokenizer: Tokenizer, texts: list[str]) -> dict[str, Any]:
    """Encode `texts` with the batch encoder and report compression and speed.

    bytes_per_token is UTF-8 bytes per token (higher = better compression); tokens_per_byte is
    its inverse, i.e. the sequence length relative to raw UTF-8 bytes (1.0 = no compression).
    roundtrip_ok says decode(encode(text)) gave back every text exactly.
    """
    texts = [t for t in texts if t]
    if not texts:
        raise TokenizerConfigError(_("no evaluation text: pass at least one non-empty document"))
    tokenizer.encode_batch(texts[:1])  # warm up the Rust thread pool so it is not timed
    start = time.perf_counter()
    encoded = tokenizer.encode_batch(texts)
    seconds = max(time.perf_counter() - start, 1e-9)

    n_tokens = sum(len(ids) for ids in encoded)
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    n_chars = sum(len(t) for t in texts)
    roundtrip_ok = all(tokenizer.decode(ids) == t for ids, t in zip(encoded, texts, strict=True))
    return {
        "documents": len(texts),
        "chars": n_chars,
        "bytes": n_bytes,
        "tokens": n_tokens,
        "bytes_per_token": n_bytes / max(n_tokens, 1),
        "chars_per_token": n_chars / max(n_tokens, 1),
        "tokens_per_byte": n_tokens / n_bytes,
        "encode_seconds": seconds,
        "encode_tokens_per_s": n_tokens / seconds,
        "encode_mb_per_s": n_bytes / seconds / 1e6,
        "roundtrip_ok": roundtrip_ok,
        "vocab_size": tokenizer.vocab_size,
        "fingerprint": tokenizer.fingerprint(),
    }


def format_evaluation(result: dict[str, Any]) -> str:
    """The few lines `portachat tokenizer eval` prints."""
    return "\n".join(
        [
            f"tokenizer {result['fingerprint']}  vocab {result['vocab_size']:,}",
            _("held-out: {documents} documents, {bytes} bytes -> {tokens} tokens").format(
                documents=f"{result['documents']:,}", bytes=f"{result['bytes']:,}", tokens=f"{result['tokens']:,}"),
            f"bytes/token {result['bytes_per_token']:.3f}  chars/token {result['chars_per_token']:.3f}  "
            f"tokens/byte {result['tokens_per_byte']:.3f} " + _("(vs 1.000 for raw UTF-8 bytes)"),
            _("encode: {tps} tokens/s, {mbps} MB/s ({seconds}s)").format(
                tps=f"{result['encode_tokens_per_s']:,.0f}", mbps=f"{result['encode_mb_per_s']:.2f}",
                seconds=f"{result['encode_seconds']:.3f}"),
            _("decode round trip: {verdict}").format(verdict=_("ok") if result["roundtrip_ok"] else _("MISMATCH")),
        ]
    )
