"""The Responses API's parts without a client library: items <-> chat messages, the store's bounds and
ownership on disk, and the route's answers to other API keys (403), missing ids (404) and bad input
(400), against a real server over a tiny random model."""

from __future__ import annotations

import json

import httpx
import pytest
from api_testing import chat_tokenizer, served_tiny, start_server

from portachat.serve.api import response_store
from portachat.serve.api.errors import APIError
from portachat.serve.api.response_items import chat_messages, function_tools, normalised_input, text_format
from portachat.serve.api.response_store import ResponseStore, StoredResponse
from tests.serve.test_response_items import ANSWER, NEXT, QUESTION, expected_prompt, server_output


def test_items_become_the_chat_messages_templates_read():
    items = normalised_input([
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": '{"city": "paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "reasoning", "summary": []},
    ])
    assert all(item["id"] for item in items)
    assert chat_messages(items, "Be brief.") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "weather", "arguments": '{"city": "paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    assert function_tools([{"type": "function", "name": "f", "parameters": {"type": "object"}}]) == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert text_format({"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}) == {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": None}}
    thought = normalised_input([{"type": "reasoning", "content": [{"type": "reasoning_text", "text": "hmm"}]},
                                {"role": "assistant", "content": "81"}])
    assert chat_messages(thought, None) == [{"role": "assistant", "content": "81", "reasoning_content": "hmm"}]
    for bad in ([], [{"type": "image"}], [{"role": "tool", "content": "x"}], [{"type": "function_call"}]):
        with pytest.raises(APIError):
            normalised_input(bad)
    with pytest.raises(APIError):
        function_tools([{"type": "web_search"}])


def _stored(n: int, owner: str = "a", size: int = 10) -> StoredResponse:
    response = {"id": f"resp_{n:032x}", "created_at": float(n), "output": [], "pad": "x" * size}
    return StoredResponse(owner, response, [], [])


def test_the_store_is_bounded_oldest_first_and_survives_a_restart(tmp_path):
    store = ResponseStore(tmp_path, max_count=3, max_item_bytes=2000)
    for n in range(5):
        assert store.put(_stored(n))
    assert [store.get(f"resp_{n:032x}") is not None for n in range(5)] == [False, False, True, True, True]
    assert not store.put(_stored(9, size=5000))  # one response past max_item_bytes is not kept
    assert not list(tmp_path.glob("resp_*.json")) and not list(tmp_path.glob(".tmp-*"))  # all in responses.sqlite
    again = ResponseStore(tmp_path, max_count=3)
    assert again.owner_of(f"resp_{4:032x}") == "a" and again.delete(f"resp_{4:032x}")
    assert again.get(f"resp_{4:032x}") is None and not again.delete(f"resp_{4:032x}")
    by_bytes = ResponseStore(tmp_path / "b", max_bytes=600)
    for n in range(4):
        by_bytes.put(_stored(n, size=150))
    assert by_bytes.get(f"resp_{0:032x}") is None and by_bytes.get(f"resp_{3:032x}") is not None


def test_opening_a_store_reads_no_response_bodies_and_owner_checks_read_none(tmp_path, monkeypatch):
    store = ResponseStore(tmp_path)
    for n in range(50):
        store.put(_stored(n, owner="a" if n % 2 else "b"))
    parsed = []
    real_loads = json.loads
    monkeypatch.setattr(response_store.json, "loads", lambda text, **kw: parsed.append(text) or real_loads(text, **kw))
    again = ResponseStore(tmp_path)
    assert [again.owner_of(f"resp_{n:032x}") for n in range(4)] == ["b", "a", "b", "a"]
    assert again.owner_of(f"resp_{99:032x}") is None and parsed == []  # start-up and owner checks: no body
    assert again.get(f"resp_{7:032x}").response["id"] == f"resp_{7:032x}" and len(parsed) == 1  # a read: one


def test_a_store_of_json_files_is_moved_into_the_database_at_open(tmp_path):
    old = [_stored(n, owner="a") for n in range(3)]
    for stored in old:  # the layout before the database: one file per response
        (tmp_path / f"{stored.response['id']}.json").write_text(json.dumps(
            {"owner": stored.owner, "response": stored.response, "input_items": [{"id": "i"}], "history": [{"h": 1}]}))
    (tmp_path / "resp_notes.json").write_text("not ours")
    store = ResponseStore(tmp_path, max_count=2)
    assert store.get(old[0].response["id"]) is None  # over max_count: the oldest goes, as before
    kept = store.get(old[2].response["id"])
    assert kept.owner == "a" and kept.input_items == [{"id": "i"}] and kept.history == [{"h": 1}]
    assert [p.name for p in tmp_path.glob("resp_*.json")] == ["resp_notes.json"]  # a foreign file stays
    assert ResponseStore(tmp_path).owner_of(old[1].response["id"]) == "a"


@pytest.fixture(scope="module")
def server(small_tokenizer):
    running = start_server(served_tiny(chat_tokenizer(small_tokenizer)), api_keys=["key-a", "key-b"])
    yield running
    running.stop()


def test_responses_belong_to_the_key_that_made_them(server):
    a, b = ({"Authorization": f"Bearer {k}"} for k in ("key-a", "key-b"))
    made = httpx.post(f"{server.url}/v1/responses", headers=a, timeout=60,
                      json={"model": "tiny", "input": "hi", "max_output_tokens": 3}).json()
    assert made["object"] == "response" and made["store"] is True
    url = f"{server.url}/v1/responses/{made['id']}"
    assert httpx.get(url, headers=a).json()["id"] == made["id"]
    for method in ("GET", "DELETE"):
        assert httpx.request(method, url, headers=b).status_code == 403
    assert httpx.get(url + "/input_items", headers=b).status_code == 403
    chained = httpx.post(f"{server.url}/v1/responses", headers=b, timeout=60, json={
        "model": "tiny", "input": "more", "previous_response_id": made["id"], "max_output_tokens": 3})
    assert chained.status_code == 403 and chained.json()["error"]["param"] == "response_id"
    assert httpx.delete(url, headers=a).json() == {"id": made["id"], "object": "response.deleted", "deleted": True}
    assert httpx.get(url, headers=a).status_code == 404


def test_bad_requests_get_400_naming_the_field(server):
    headers = {"Authorization": "Bearer key-a"}
    step = {"type": "code_interpreter_call", "code": "1+1", "outputs": [{"type": "image", "url": "https://x"}]}
    for body, param in (({"model": "tiny"}, "input"), ({"model": "tiny", "input": [{"type": "image"}]}, "input[0].type"),
                        ({"model": "tiny", "input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
                        ({"model": "tiny", "input": [step]}, "input[0].outputs[0]")):
        reply = httpx.post(f"{server.url}/v1/responses", headers=headers, json=body, timeout=60)
        assert reply.status_code == 400 and reply.json()["error"]["param"] == param, reply.text
    made = httpx.post(f"{server.url}/v1/responses", headers=headers, timeout=60,
                      json={"model": "tiny", "input": "hi", "max_output_tokens": 2}).json()
    page = httpx.get(f"{server.url}/v1/responses/{made['id']}/input_items?limit=0", headers=headers)
    assert page.status_code == 400 and page.json()["error"]["param"] == "limit"


def test_a_calculator_step_goes_back_as_input_and_stays_in_the_stored_history(server, small_tokenizer):
    """The Agents SDK's second turn: the first reply's output (a code_interpreter_call, then the answer)
    resent as input, then a third turn through previous_response_id; each prompt is the conversation with
    the model's own calculator turn in it, token for token (counted by usage.input_tokens)."""
    tok, headers = chat_tokenizer(small_tokenizer), {"Authorization": "Bearer key-a"}
    items = [{"role": "user", "content": QUESTION}, *server_output(tok), {"role": "user", "content": NEXT}]
    second = httpx.post(f"{server.url}/v1/responses", headers=headers, timeout=60, json={
        "model": "tiny", "input": items, "max_output_tokens": 2, "temperature": 0})
    assert second.status_code == 200, second.text
    second = second.json()
    assert second["usage"]["input_tokens"] == len(expected_prompt(tok))
    assert [item["type"] for item in second["output"]] == ["message"]
    third = httpx.post(f"{server.url}/v1/responses", headers=headers, timeout=60, json={
        "model": "tiny", "input": "thanks", "previous_response_id": second["id"], "max_output_tokens": 2})
    assert third.status_code == 200, third.text
    conversation = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": [
        {"type": "python", "text": "23+58"}, {"type": "python_output", "text": "81"}, {"type": "text", "text": ANSWER}]},
                    {"role": "user", "content": NEXT}, {"role": "assistant", "content": second["output"][0]["content"][0]["text"]},
                    {"role": "user", "content": "thanks"}]
    assert third.json()["usage"]["input_tokens"] == len(tok.render_prompt(conversation))
