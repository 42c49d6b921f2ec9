"""Documents -> overlapping chunks that fit the embedding model: split at sentence ends of both
languages (。！？； and . ! ? ; and line breaks), pack whole sentences up to a token budget, and
start each chunk with the last sentences of the one before (the overlap), so a fact that straddles
a boundary is still found whole in one chunk. Offsets point into the original text (citations say
where a passage came from)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

# A sentence ends after CJK terminators (full-width, no space needed), after ASCII ! ? ; and a
# period when whitespace or the end follows (so 3.14 and example.com stay whole), with any closing
# quotes or brackets, or at a line break.
_BOUNDARY = re.compile(r"[。！？；]+[”’」』）】\"')\]]*|[.!?;]+[”’\"')\]]*(?=\s|$)|\n")
# Characters of a long sentence counted per cut, per token of the budget (English runs ~4-5 per token).
WINDOW_CHARS_PER_TOKEN = 6


@dataclass(frozen=True)
class Chunk:
    index: int  # position in the document, from 0
    text: str
    start: int  # character offsets into the document's text
    end: int
    tokens: int  # as the budget's counter counted them


def split_sentences(text: str) -> list[tuple[int, int]]:
    """(start, end) character spans of the sentences, surrounding whitespace excluded, empty ones dropped."""
    spans = []
    start = 0
    for m in _BOUNDARY.finditer(text):
        spans.append((start, m.end()))
        start = m.end()
    spans.append((start, len(text)))
    out = []
    for a, b in spans:
        piece = text[a:b]
        stripped = piece.strip()
        if stripped:
            lead = len(piece) - len(piece.lstrip())
            out.append((a + lead, a + lead + len(stripped)))
    return out


def _split_long(text: str, span: tuple[int, int], max_tokens: int, count: Callable[[str], int]) -> list[tuple[int, int]]:
    """A sentence over the budget, cut into pieces that fit (at spaces where there are some).

    Each cut counts only a window a few budgets wide after the piece's start, never the rest of the
    sentence: counting what is left on every cut made a long text without a full stop quadratic
    (80k characters took 4 s, 320k took 38 s). The window doubles while it holds no more than a budget
    of tokens (long tokens), so every cut still sees past its end and the work stays linear."""
    pieces = []
    a, end = span
    width = WINDOW_CHARS_PER_TOKEN * max_tokens
    while a < end:
        stop = min(end, a + width)
        n = count(text[a:stop])
        if n <= max_tokens:
            if stop == end:
                pieces.append((a, end))
                break
            width *= 2
            continue
        b = a + max(1, int((stop - a) * max_tokens / n))
        while b > a + 1 and (m := count(text[a:b])) > max_tokens:  # shrink in proportion, a little extra
            b = a + max(1, min(int((b - a) * 0.95), int((b - a) * max_tokens / m)))
        space = text.rfind(" ", a + 1, b)
        if space > a + (b - a) // 2:  # prefer a word boundary in the second half
            b = space
        pieces.append((a, b))
        a = b
        while a < end and text[a].isspace():
            a += 1
    return pieces


def chunk_text(text: str, max_tokens: int = 256, overlap_tokens: int = 48,
               count: Callable[[str], int] = len) -> list[Chunk]:
    """Chunks of at most `max_tokens` (as `count` counts; default characters), whole sentences where
    they fit, each repeating up to `overlap_tokens` of trailing sentences from the chunk before."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    overlap_tokens = max(0, min(overlap_tokens, max_tokens // 2))
    units: list[tuple[int, int, int]] = []  # (start, end, tokens)
    for span in split_sentences(text):
        n = count(text[span[0]:span[1]])
        parts = [span] if n <= max_tokens else _split_long(text, span, max_tokens, count)
        units += [(a, b, n if len(parts) == 1 else count(text[a:b])) for a, b in parts]
    chunks: list[Chunk] = []
    current: list[tuple[int, int, int]] = []
    used = 0  # tokens in `current`, kept as a running sum: summing per unit was quadratic in a chunk

    def emit() -> None:
        a, b = current[0][0], current[-1][1]
        chunks.append(Chunk(len(chunks), text[a:b], a, b, used))

    fresh = 0  # units in `current` not yet emitted in an earlier chunk
    for unit in units:
        if current and used + unit[2] > max_tokens:
            if fresh:
                emit()
            carried: list[tuple[int, int, int]] = []
            kept = 0
            for u in reversed(current):  # the overlap: trailing sentences within its budget
                if kept + u[2] > overlap_tokens or len(carried) + 1 >= len(current):
                    break
                carried.append(u)
                kept += u[2]
            carried.reverse()
            while carried and kept + unit[2] > max_tokens:
                kept -= carried.pop(0)[2]
            current, used, fresh = carried, kept, 0
        current.append(unit)
        used += unit[2]
        fresh += 1
    if current and fresh:
        emit()
    return chunks
