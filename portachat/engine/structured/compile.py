"""Spec -> llguidance grammar -> one matcher per sequence; batched mask fills.

Compiled grammars are cached (a template matcher per grammar text, deep-copied per sequence), so a
schema sent with every request is compiled once. Errors name the part the library cannot handle:
llguidance reports e.g. `Unimplemented keys: ["not"]` or the regex position.

The cache is bounded in bytes, least recently used out first. A compile is followed by a probe (the
first two masks of a copy, where llguidance builds most of its lexer): a grammar past the library's
limits there (`(a{1000}){1000}` costs ~170 MB and then fails with "too many expressions") is refused
with a 400 naming the limit and is not cached. A grammar's bytes are the heap's growth over compile
and probe (memory.py), at least a floor from its text; one bigger than the whole cache is refused.
Compiles run one at a time, so each growth is its own and a burst of heavy grammars cannot stack up.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

import torch

from portachat.engine.structured.masks import allocate_bitmask
from portachat.engine.structured.memory import heap_in_use
from portachat.engine.structured.spec import StructuredError, StructuredSpec
from portachat.engine.structured.tokenizer import ll_tokenizer
from portachat.engine.types import EngineError
from portachat.i18n import _
from portachat.tokenizer.protocol import ChatTokenizer

# JSON as people write it on one line ({"a": 1, "b": [2, 3]}): fixed separators and no free
# whitespace, so a small model cannot wander into endless newlines between tokens.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
CACHE_BYTES = 256 * 2**20  # default bound of the compiled-grammar cache (serve: --grammar-cache-mb)
# Least a grammar is charged, whatever the heap says (a reused or concurrently freed heap can read as
# no growth): the matcher's own tables, plus its text many times over (a 1.4 kB JSON schema measured
# 0.23 MB after the probe, a short regex 40 kB).
ENTRY_FLOOR_BYTES = 64 * 2**10
TEXT_FACTOR = 64
# Masks of up to this many rows are filled one after another on the calling thread (tens of us
# each); more go to llguidance's thread pool, whose idle workers spin for a while and would steal
# the cores the model's forward needs on a small CPU.
PARALLEL_ROWS = 16


def json_options(whitespace_pattern: str | None = None) -> dict[str, Any]:
    if whitespace_pattern is None:
        return dict(JSON_OPTIONS)
    return {"whitespace_flexible": True, "whitespace_pattern": whitespace_pattern,
            "item_separator": ",", "key_separator": ":"}


def grammar_text(spec: StructuredSpec) -> str:
    """The llguidance grammar (a JSON string) for a spec; StructuredError when it cannot be built."""
    from llguidance import LLMatcher, grammar_from  # deferred: optional package

    try:
        if spec.kind in ("json", "json_object"):
            schema = spec.value if spec.kind == "json" else {"type": "object"}
            if schema is True:
                schema = {}
            return LLMatcher.grammar_from_json_schema(schema, defaults=json_options(spec.whitespace_pattern))
        if spec.kind == "regex":
            return LLMatcher.grammar_from_regex(spec.value)
        if spec.kind == "choice":
            lark = "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in spec.value)
            return LLMatcher.grammar_from_lark(lark)
        return grammar_from("grammar", spec.value)  # Lark, or GBNF converted to Lark
    except (ValueError, TypeError) as exc:
        raise StructuredError(_("{param}: cannot compile the {kind} constraint: {error}").format(
            param=spec.param, kind=spec.kind, error=exc), spec.param) from None


class Constraints:
    """Matchers for one engine's tokenizer and vocabulary; built on the first constrained request."""

    def __init__(self, tokenizer: ChatTokenizer, vocab_size: int, cache_bytes: int = CACHE_BYTES) -> None:
        try:
            import llguidance  # deferred: optional package
        except ImportError:
            raise EngineError(_("structured output needs the llguidance package: pip install 'portachat[serve]' "
                                "(or pip install llguidance)"), kind="internal") from None
        self.vocab_size = vocab_size
        self.tokenizer = ll_tokenizer(tokenizer, vocab_size)
        self._executor: llguidance.LLExecutor | None = None
        self.cache_bytes = cache_bytes
        self._templates: OrderedDict[str, tuple[Any, int]] = OrderedDict()  # grammar -> (template, bytes)
        self._cached_bytes = 0
        self._lock = threading.Lock()  # the server compiles on its request threads, the engine reads
        self._compiling = threading.Lock()  # one compile at a time: its heap growth is its own

    @property
    def cached_bytes(self) -> int:
        """Bytes the cached grammars were charged (at most `cache_bytes`)."""
        return self._cached_bytes

    def cached(self, spec: StructuredSpec) -> bool:
        return self._lookup(grammar_text(spec)) is not None

    def _lookup(self, grammar: str) -> Any:
        with self._lock:
            entry = self._templates.get(grammar)
            if entry is None:
                return None
            self._templates.move_to_end(grammar)
            return entry[0]

    def compile(self, spec: StructuredSpec) -> Any:
        """The cached template matcher of `spec` (compiled on a miss, on the calling thread: the
        server does it before a request reaches the engine, so a heavy schema never stalls a step)."""
        from llguidance import LLMatcher  # deferred: optional package

        grammar = grammar_text(spec)
        template = self._lookup(grammar)
        if template is not None:
            return template
        with self._compiling:
            template = self._lookup(grammar)  # another thread may have compiled it meanwhile
            if template is not None:
                return template
            before = heap_in_use()
            is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, self.tokenizer)
            if is_error:
                raise StructuredError(_("{param}: cannot compile the {kind} constraint: {error}").format(
                    param=spec.param, kind=spec.kind, error=messages[0]), spec.param)
            template = LLMatcher(self.tokenizer, grammar, log_level=0)
            if template.is_error():
                raise StructuredError(_("{param}: cannot compile the {kind} constraint: {error}").format(
                    param=spec.param, kind=spec.kind, error=template.get_error()), spec.param)
            reason = self._probe(template)
            after = heap_in_use()
            size = max(ENTRY_FLOOR_BYTES + TEXT_FACTOR * len(grammar), after - before)
            if reason is not None or size > self.cache_bytes:
                del template  # the error's traceback holds this frame: let the grammar's memory go now
            if reason is not None:
                raise StructuredError(_("{param}: the {kind} constraint is past the grammar library's limits "
                                        "({reason}); simplify it (fewer or smaller repetitions and "
                                        "alternatives).").format(param=spec.param, kind=spec.kind, reason=reason),
                                      spec.param)
            if size > self.cache_bytes:
                raise StructuredError(_("{param}: the {kind} constraint compiles to about {mb} MB, more than the "
                                        "grammar cache holds (--grammar-cache-mb {limit}); simplify it or raise "
                                        "the flag.").format(param=spec.param, kind=spec.kind, mb=-(-size // 2**20),
                                                            limit=self.cache_bytes // 2**20), spec.param)
            self._insert(grammar, template, size)
        return template

    def _probe(self, template: Any) -> str | None:
        """The first two masks of a copy (the first allowed token consumed between them): where
        llguidance builds its lexer, and where a grammar past its limits fails; the reason then."""
        probe = template.deep_copy()
        bitmask = allocate_bitmask(1, self.vocab_size)
        probe.unsafe_compute_mask_ptr(bitmask.data_ptr(), bitmask.shape[1] * 4)
        if not probe.is_error():
            allowed = _first_allowed(bitmask[0], self.vocab_size)
            if allowed is not None and probe.consume_token(allowed) and not probe.is_stopped():
                probe.unsafe_compute_mask_ptr(bitmask.data_ptr(), bitmask.shape[1] * 4)
        if not probe.is_error():
            return None
        return probe.get_error().strip().splitlines()[0]  # the rest is the parser's state dump

    def _insert(self, grammar: str, template: Any, size: int) -> None:
        with self._lock:
            self._templates[grammar] = (template, size)
            self._cached_bytes += size
            while self._cached_bytes > self.cache_bytes:
                _grammar, (_template, evicted) = self._templates.popitem(last=False)
                self._cached_bytes -= evicted

    def matcher(self, spec: StructuredSpec) -> Any:
        """A fresh llguidance.LLMatcher at the start of `spec`'s grammar."""
        return self.compile(spec).deep_copy()

    def fill(self, matchers: list[Any], bitmask: torch.Tensor) -> None:
        """Next-token masks of `matchers` into rows 0.. of `bitmask` (int32 [R, ceil(V/32)], CPU,
        contiguous), one bit per token. llguidance releases the GIL while it works."""
        rows, words = bitmask.shape
        if len(matchers) > rows or words * 32 < self.vocab_size or not bitmask.is_contiguous():
            raise ValueError(f"bitmask {tuple(bitmask.shape)} too small for {len(matchers)} rows of {self.vocab_size}")
        if len(matchers) <= PARALLEL_ROWS:
            for i, m in enumerate(matchers):
                m.unsafe_compute_mask_ptr(bitmask.data_ptr() + i * words * 4, words * 4)
            return
        if self._executor is None:
            import llguidance  # deferred: optional package

            self._executor = llguidance.LLExecutor()
        self._executor.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(matchers)], bitmask.data_ptr(),
                                               words * 4, rows)


def _first_allowed(row: torch.Tensor, vocab_size: int) -> int | None:
    """The lowest token id whose bit is set in one packed mask row, or None."""
    for word_index, word in enumerate(row.tolist()):
        if word:
            token = word_index * 32 + ((word & -word).bit_length() - 1)
            return token if token < vocab_size else None
    return None
