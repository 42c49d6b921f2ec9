"""A web page the operator opens must not drive the server: cross-site Origins, rebinding Hosts and
non-JSON bodies are refused before anything runs, while the server's own chat page keeps working."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.security.http_helpers import CHAT, assert_error, assert_healthy, start_tiny, tokens_processed
from tests.serve.api_testing import chat_tokenizer

EVIL = "http://evil.example"


@pytest.fixture(scope="module")
def server(small_tokenizer):
    running = start_tiny(chat_tokenizer(small_tokenizer), cors_origins=["http://page.test"])
    yield running
    running.stop()


def post_chat(server, **kwargs) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/chat/completions", timeout=60, **kwargs)


def test_a_cross_site_text_plain_post_generates_nothing(server):
    # What a page's fetch(url, {method: "POST", body: JSON.stringify(...)}) sends: no preflight needed.
    body = json.dumps(CHAT)
    before = tokens_processed(server.url)
    assert_error(post_chat(server, content=body, headers={"content-type": "text/plain;charset=UTF-8",
                                                          "origin": EVIL}), 403, "forbidden_origin")
    # The same body with no Origin (a browser that leaves it out, a script): still not JSON.
    error = assert_error(post_chat(server, content=body, headers={"content-type": "text/plain"}), 415,
                         "unsupported_media_type")
    assert "application/json" in error["message"]
    assert tokens_processed(server.url) == before
    assert_healthy(server.url)


def test_a_multipart_form_to_a_json_route_is_415(server):
    form = {"model": "tiny", "messages": json.dumps(CHAT["messages"])}
    before = tokens_processed(server.url)
    assert_error(post_chat(server, data=form, files={"f": ("a.txt", b"x")}), 415, "unsupported_media_type")
    assert_error(post_chat(server, data=form), 415, "unsupported_media_type")  # urlencoded, a plain <form>
    assert_error(httpx.post(f"{server.url}/models/load", data={"model": "tiny"}, timeout=30), 415)
    assert tokens_processed(server.url) == before
    # multipart stays the file upload's own format; JSON there is the wrong one
    upload = httpx.post(f"{server.url}/v1/files", data={"purpose": "assistants"}, files={"file": ("a.txt", b"hi")},
                        timeout=30)
    assert upload.status_code == 200, upload.text
    assert_error(httpx.post(f"{server.url}/v1/files", json={"purpose": "assistants"}, timeout=30), 415)
    assert_healthy(server.url)


def test_json_with_a_charset_or_a_json_suffix_is_accepted(server):
    for kind in ("application/json; charset=utf-8", "application/vnd.api+json"):
        r = post_chat(server, content=json.dumps(CHAT), headers={"content-type": kind})
        assert r.status_code == 200, (kind, r.text)


def test_a_foreign_origin_is_403_while_no_origin_the_same_origin_and_cors_origins_work(server):
    error = assert_error(post_chat(server, json=CHAT, headers={"origin": EVIL}), 403, "forbidden_origin")
    assert "--cors-origins" in error["message"] and EVIL in error["message"]
    assert_error(httpx.get(f"{server.url}/v1/models", headers={"origin": EVIL}, timeout=10), 403)
    assert_error(post_chat(server, json=CHAT, headers={"origin": "null"}), 403)  # a sandboxed frame, a file://
    # the same host on another port is another site
    port = int(server.url.rsplit(":", 1)[1])
    assert_error(post_chat(server, json=CHAT, headers={"origin": f"http://127.0.0.1:{port + 1}"}), 403)
    assert post_chat(server, json=CHAT).status_code == 200  # curl, SDKs: no Origin
    assert post_chat(server, json=CHAT, headers={"origin": server.url}).status_code == 200  # the chat page
    assert post_chat(server, json=CHAT, headers={"origin": "http://page.test"}).status_code == 200  # --cors-origins
    assert_healthy(server.url)


def test_a_rebinding_host_on_a_loopback_server_is_403(server):
    port = server.url.rsplit(":", 1)[1]
    error = assert_error(post_chat(server, json=CHAT, headers={"host": f"evil.example:{port}"}), 403,
                         "forbidden_host")
    assert "127.0.0.1" in error["message"]
    # the attacker's page is same-origin with its own (rebound) name: the Host check alone stops it
    r = httpx.get(f"{server.url}/v1/models", headers={"host": "evil.example", "origin": "http://evil.example"},
                  timeout=10)
    assert_error(r, 403, "forbidden_host")
    for name in (f"localhost:{port}", f"127.0.0.2:{port}", f"[::1]:{port}", "LOCALHOST"):
        assert httpx.get(f"{server.url}/v1/models", headers={"host": name}, timeout=10).status_code == 200, name
    assert_healthy(server.url)


def test_a_server_on_every_interface_serves_any_host(small_tokenizer):
    server = start_tiny(chat_tokenizer(small_tokenizer), host="0.0.0.0")
    try:
        r = httpx.get(f"{server.url}/v1/models", headers={"host": "chat.example.com"}, timeout=10)
        assert r.status_code == 200, r.text
        # behind a TLS proxy: the page is https://chat.example.com, the Host has no port
        r = httpx.get(f"{server.url}/v1/models", headers={"host": "chat.example.com",
                                                          "origin": "https://chat.example.com"}, timeout=10)
        assert r.status_code == 200, r.text
        assert_error(httpx.get(f"{server.url}/v1/models", headers={"host": "chat.example.com", "origin": EVIL},
                               timeout=10), 403)
    finally:
        server.stop()
