"""Incremental detokenization: token ids in, text deltas out, never half a character.

Byte-level BPE splits multi-byte characters (Chinese, emoji) across tokens, so text is decoded from
each token's raw bytes through an incremental UTF-8 decoder that holds back an unfinished
character. Stop strings are matched on the text; the tail that could still become a stop string is
held back too, so no stop string ever reaches a stream.
"""

from __future__ import annotations

import codecs


class Detokenizer:
    def __init__(self, token_bytes, stop: list[str]) -> None:
        self._token_bytes = token_bytes  # callable: id -> bytes (b"" for control tokens)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.stop = [s for s in stop if s]
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        self.text = ""  # everything decoded so far (up to a stop string once one matched)
        self.emitted = 0  # characters of `text` already handed out
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text (the earliest match)

    def add(self, token_id: int, decode: bool = True) -> None:
        """Append one token's bytes (`decode=False`: the token counts but shows no text, e.g. eos)."""
        if self.stopped or not decode:
            return
        piece = self._decoder.decode(self._token_bytes(token_id))
        if not piece:
            return
        search_from = max(0, len(self.text) - self._hold)
        self.text += piece
        for s in self.stop:
            at = self.text.find(s, search_from)
            if at != -1:
                self.text = self.text[:at]
                self.stopped = True
                self.matched = s
        # With several stop strings the earliest match wins: text was cut at each match in turn.

    def delta(self, final: bool = False) -> str:
        """New text safe to show: all of it when `final`, else all but a possible stop-string prefix."""
        if final and not self.stopped:
            # A reply cut short (max_tokens) can end inside a character: drop its partial bytes rather
            # than show U+FFFD; the streamed and the whole reply stay equal either way.
            self._decoder.reset()
        end = len(self.text)
        if not final and not self.stopped and self._hold:
            end = max(self.emitted, end - self._held_tail())
        out = self.text[self.emitted : end]
        self.emitted = end
        return out

    def _held_tail(self) -> int:
        """Length of the longest suffix of the text that is a proper prefix of some stop string."""
        best = 0
        tail = self.text[-self._hold :]
        for s in self.stop:
            for n in range(min(len(s) - 1, len(tail)), best, -1):
                if tail.endswith(s[:n]):
                    best = n
                    break
        return best
