"""HTTP error bodies and registry errors speak the server's language: English by default, Chinese
under PORTACHAT_LANG=zh, with the values (parameters, limits, names) filled in either way."""

from __future__ import annotations

import json

import pytest

from portachat.serve.api.errors import APIError
from portachat.serve.api.protocol import (
    MAX_STOP_SEQUENCES,
    ChatCompletionRequest,
    check_supported,
    parse_body,
)
from portachat.serve.registry.keep_alive import parse_keep_alive

LOCALE_VARS = ("PORTACHAT_LANG", "LANGUAGE", "LC_ALL", "LC_MESSAGES", "LANG")


@pytest.fixture
def lang(monkeypatch):
    for var in LOCALE_VARS:
        monkeypatch.delenv(var, raising=False)
    return lambda code: monkeypatch.setenv("PORTACHAT_LANG", code)


def _error(raw: bytes) -> APIError:
    with pytest.raises(APIError) as caught:
        check_supported(parse_body(raw, ChatCompletionRequest))
    return caught.value


@pytest.mark.parametrize("code, missing, too_many", [
    ("en", "Missing required parameter: 'messages'.", "At most {n} stop sequences are allowed (got {m})."),
    ("zh", "缺少必需参数：'messages'。", "最多允许 {n} 个停止序列（收到 {m} 个）。"),
])
def test_http_error_bodies_follow_the_language(lang, code, missing, too_many):
    lang(code)
    error = _error(b'{"model": "m"}')
    assert (error.status, error.message, error.param, error.code) == (400, missing, "messages", "invalid_value")
    stops = [f"s{i}" for i in range(MAX_STOP_SEQUENCES + 1)]
    error = _error(json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stop": stops}).encode())
    expected = too_many.format(n=MAX_STOP_SEQUENCES, m=MAX_STOP_SEQUENCES + 1)
    assert (error.message, error.param) == (expected, "stop")  # param and code stay the identifiers clients match


def test_registry_input_errors_follow_the_language(lang):
    lang("zh")
    with pytest.raises(ValueError, match="keep_alive 必须是 '30s'、'5m'、'1h' 这样的时长或秒数.*收到 'soon'"):
        parse_keep_alive("soon")
    lang("en")
    with pytest.raises(ValueError, match="keep_alive must be a duration like '30s'.*got 'soon'"):
        parse_keep_alive("soon")
