"""Spec -> llguidance grammar -> one matcher per sequence; batched mask fills.

Compiled grammars are cached (a template matcher per grammar text, deep-copied per sequence), so a
schema sent with every request is compiled once. Errors name the part the library cannot handle:
llguidance reports e.g. `Unimplemented keys: ["not"]` or the regex position.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

import torch

from portachat.engine.structured.spec import StructuredError, StructuredSpec
from portachat.engine.structured.tokenizer import ll_tokenizer
from portachat.engine.types import EngineError
from portachat.tokenizer.protocol import ChatTokenizer

# JSON as people write it on one line ({"a": 1, "b": [2, 3]}): fixed separators and no free
# whitespace, so a small model cannot wander into endless newlines between tokens.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
CACHE_SIZE = 64
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
    from llguidance import LLMatcher, grammar_from

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
        raise StructuredError(f"{spec.param}: cannot compile the {spec.kind} constraint: {exc}", spec.param) from None


class Constraints:
    """Matchers for one engine's tokenizer and vocabulary; built on the first constrained request."""

    def __init__(self, tokenizer: ChatTokenizer, vocab_size: int) -> None:
        try:
            import llguidance
        except ImportError:
            raise EngineError("structured output needs the llguidance package: pip install 'portachat[serve]' "
                              "(or pip install llguidance)", kind="internal") from None
        self.vocab_size = vocab_size
        self.tokenizer = ll_tokenizer(tokenizer, vocab_size)
        self._executor: llguidance.LLExecutor | None = None
        self._templates: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()  # the server compiles on its request threads, the engine reads

    def compile(self, spec: StructuredSpec) -> Any:
        """The cached template matcher of `spec` (compiled on a miss, on the calling thread: the
        server does it before a request reaches the engine, so a heavy schema never stalls a step)."""
        from llguidance import LLMatcher

        grammar = grammar_text(spec)
        with self._lock:
            template = self._templates.get(grammar)
            if template is not None:
                self._templates.move_to_end(grammar)
                return template
        is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, self.tokenizer)
        if is_error:
            raise StructuredError(f"{spec.param}: cannot compile the {spec.kind} constraint: {messages[0]}", spec.param)
        template = LLMatcher(self.tokenizer, grammar, log_level=0)
        if template.is_error():
            raise StructuredError(f"{spec.param}: cannot compile the {spec.kind} constraint: {template.get_error()}",
                                  spec.param)
        with self._lock:
            self._templates[grammar] = template
            if len(self._templates) > CACHE_SIZE:
                self._templates.popitem(last=False)
        return template

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
            import llguidance

            self._executor = llguidance.LLExecutor()
        self._executor.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(matchers)], bitmask.data_ptr(),
                                               words * 4, rows)
