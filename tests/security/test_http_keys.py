"""Several API keys, an admin key for loading, unloading and pinning models, and the owner id routes read
(request_owner: files and vector stores belong to the key that made them)."""

from __future__ import annotations

import hashlib

import httpx
import openai
import pytest
from fastapi import Request
from fastapi.responses import JSONResponse

from portachat.cli import build_parser
from portachat.commands.serve import api_keys
from portachat.serve.api.owner import request_owner
from tests.security.http_helpers import HELLO, assert_error, assert_healthy, start_two_models, statuses
from tests.serve.api_testing import chat_tokenizer

KEYS = ["first-key", "second-key"]
ADMIN = "admin-key"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def tok(small_tokenizer):
    return chat_tokenizer(small_tokenizer)


@pytest.fixture(scope="module")
def server(tok):
    running = start_two_models(tok, keep_alive=60, api_keys=KEYS, admin_api_key=ADMIN, allow_unload=True)

    async def whoami(request: Request) -> JSONResponse:  # what the document routes will read
        return JSONResponse({"owner": request_owner(request)})

    running.server.config.app.add_api_route("/whoami", whoami, methods=["GET"])
    yield running
    running.stop()


def test_two_keys_both_work_and_others_get_401(server):
    for key in KEYS:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=60)
        assert client.chat.completions.create(model="a", messages=HELLO, max_tokens=2).choices
    error = assert_error(httpx.get(f"{server.url}/v1/models", headers=bearer("first-key,second-key"), timeout=10),
                         401, "invalid_api_key")
    assert "PORTACHAT_API_KEY" in error["message"]
    assert_error(httpx.get(f"{server.url}/v1/models", timeout=10), 401)
    assert_healthy(server.url)


def test_each_key_has_its_own_stable_owner_id(server):
    owners = [httpx.get(f"{server.url}/whoami", headers=bearer(k), timeout=10).json()["owner"]
              for k in [*KEYS, KEYS[0], ADMIN]]
    assert owners[0] == owners[2] == hashlib.sha256(b"first-key").hexdigest()[:16]
    assert len(set(owners)) == 3 and all(len(o) == 16 and "key" not in o for o in owners)


def test_admin_routes_need_the_admin_key(server):
    for path in ("/models/load", "/models/unload"):
        error = assert_error(httpx.post(f"{server.url}{path}", json={"model": "b"}, headers=bearer(KEYS[0]),
                                        timeout=30), 403, "admin_key_required")
        assert "--admin-api-key" in error["message"]
    assert statuses(server.url, bearer(KEYS[0]))["b"] == "available"  # nothing was loaded
    r = httpx.post(f"{server.url}/models/load", json={"model": "b"}, headers=bearer(ADMIN), timeout=30)
    assert r.status_code == 200 and r.json()["status"] == "loaded"
    r = httpx.post(f"{server.url}/models/unload", json={"model": "b"}, headers=bearer(ADMIN), timeout=30)
    assert r.status_code == 200 and r.json()["status"] == "available"
    assert_healthy(server.url)


def test_a_keep_alive_needs_the_admin_key(server):
    body = {"model": "b", "prompt": "hi", "max_tokens": 2, "keep_alive": -1}  # pin b in memory for everyone
    error = assert_error(httpx.post(f"{server.url}/v1/completions", json=body, headers=bearer(KEYS[1]), timeout=30),
                         403, "admin_key_required")
    assert error["param"] == "keep_alive"
    assert statuses(server.url, bearer(KEYS[1]))["b"] == "available"
    r = httpx.post(f"{server.url}/v1/completions", json=body, headers=bearer(ADMIN), timeout=30)
    assert r.status_code == 200, r.text
    # without keep_alive any key may use the model
    r = httpx.post(f"{server.url}/v1/completions", json={**body, "keep_alive": None}, headers=bearer(KEYS[1]),
                   timeout=30)
    assert r.status_code == 200, r.text
    assert_healthy(server.url)


def test_a_server_with_keys_and_no_admin_key_lets_no_one_load(tok):
    server = start_two_models(tok, api_keys=KEYS)
    try:
        error = assert_error(httpx.post(f"{server.url}/models/load", json={"model": "b"}, headers=bearer(KEYS[0]),
                                        timeout=30), 403, "admin_key_required")
        assert "no admin key" in error["message"]
        assert_healthy(server.url)
    finally:
        server.stop()


def test_keys_come_from_repeated_flags_or_a_comma_separated_variable():
    assert api_keys(["a", "b"], None) == ["a", "b"]
    assert api_keys(None, "c, d,,") == ["c", "d"]
    assert api_keys(["a", "a"], None) == ["a"]  # once each
    assert api_keys(["a"], "b,c") == ["a"]  # the flags, when given, replace the variable
    assert api_keys(None, None) == []


def test_serve_parses_several_api_keys_an_admin_key_and_allow_unload():
    args = build_parser().parse_args(["serve", "--model", "m", "--api-key", "a", "--api-key", "b",
                                      "--admin-api-key", "c", "--allow-unload"])
    assert (args.api_key, args.admin_api_key, args.allow_unload) == (["a", "b"], "c", True)
    args = build_parser().parse_args(["serve", "--model", "m"])
    assert (args.api_key, args.admin_api_key, args.allow_unload) == (None, None, False)
