"""Issue 26, item 3: the compiled-grammar cache is bounded in bytes. Grammars past llguidance's
limits (`(X{1000}){1000}` builds ~170 MB of lexer, then fails with "too many expressions") are
refused with 400 naming the limit and are not cached; twenty of them leave the heap and the RSS
within the cache's bound plus a margin (before: each stayed cached, 552 MB -> 1.69 GB after six,
and each answered 500)."""

from __future__ import annotations

import httpx
import psutil
import pytest

from portachat.engine.structured import StructuredError, StructuredSpec
from portachat.engine.structured.compile import Constraints
from portachat.engine.structured.memory import heap_in_use
from portachat.tokenizer.chat_tokenizer import PortachatChatTokenizer
from tests.serve.api_testing import served_tiny, start_server, tiny_model

CACHE = 64 * 2**20
PATHOLOGICAL = [f"({x}{{1000}}){{1000}}" for x in "abcdefghijklmnopqrst"]  # twenty distinct ones
# glibc keeps some freed arenas resident: RSS may stay up to a few probes' transient (~200 MB each
# at the peak) above where it started, however many grammars went through; the heap in use may not.
RSS_MARGIN = 400 * 2**20
HEAP_MARGIN = 32 * 2**20


@pytest.fixture(scope="module")
def ours(small_tokenizer) -> PortachatChatTokenizer:
    return PortachatChatTokenizer(small_tokenizer)


def _refuse_all(ours: PortachatChatTokenizer, patterns: list[str]) -> None:
    constraints = Constraints(ours, ours.vocab_size, cache_bytes=CACHE)
    constraints.compile(StructuredSpec("regex", r"[0-9]{3}-[a-z]{2,4}"))  # library and tokenizer warm
    rss0, heap0 = psutil.Process().memory_info().rss, heap_in_use()
    for pattern in patterns:
        spec = StructuredSpec("regex", pattern, param="response_format")
        with pytest.raises(StructuredError, match="limits .*too many expressions") as caught:
            constraints.compile(spec)
        assert caught.value.param == "response_format"
        assert not constraints.cached(spec)
        assert constraints.cached_bytes <= CACHE
    assert psutil.Process().memory_info().rss - rss0 < CACHE + RSS_MARGIN
    if heap0 is not None:
        assert heap_in_use() - heap0 < CACHE + HEAP_MARGIN
    assert constraints.cached(StructuredSpec("regex", r"[0-9]{3}-[a-z]{2,4}"))  # the good one is still served


def test_pathological_regexes_are_refused_uncached_and_memory_stays_bounded(ours):
    _refuse_all(ours, PATHOLOGICAL[:5])  # five already held 850 MB before the fix; 1-3 s each to refuse


@pytest.mark.slow
def test_twenty_pathological_regexes_leave_memory_within_the_cache_bound(ours):
    _refuse_all(ours, PATHOLOGICAL)  # the probe as written (a minute on a 2-core CPU)


def test_the_cache_is_bounded_in_bytes_least_recently_used_out(ours):
    constraints = Constraints(ours, ours.vocab_size, cache_bytes=40 * 2**20)
    heavy = [StructuredSpec("regex", f"({x}{{100}}){{400}}") for x in "uvwxy"]  # tens of MB each, compilable
    for spec in heavy:
        constraints.compile(spec)
        assert constraints.cached_bytes <= 40 * 2**20
    assert constraints.cached(heavy[-1]) and not constraints.cached(heavy[0])
    with pytest.raises(StructuredError, match="grammar-cache-mb 1"):  # one bigger than the whole cache
        Constraints(ours, ours.vocab_size, cache_bytes=2**20).compile(heavy[0])


def test_the_server_answers_400_naming_the_limit_and_stays_healthy(ours):
    server = start_server(served_tiny(ours, model=tiny_model(ours.vocab_size), grammar_cache_bytes=CACHE))
    try:
        for pattern in PATHOLOGICAL[:2]:
            r = httpx.post(f"{server.url}/v1/chat/completions", timeout=120, json={
                "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                "structured_outputs": {"regex": pattern}})
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert "too many expressions" in error["message"] and error["param"] == "structured_outputs.regex"
        ok = httpx.post(f"{server.url}/v1/chat/completions", timeout=120, json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
            "structured_outputs": {"regex": "[0-9]{3}"}})
        assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"].isdigit()
        assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200
    finally:
        server.stop()
