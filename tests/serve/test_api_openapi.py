"""GET /openapi.json describes the bodies the routes really read and write: real requests and real
replies from the running server validate against it, and wrong requests do not."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from api_testing import chat_tokenizer, served_tiny, start_server


@pytest.fixture(scope="module")
def server(small_tokenizer):
    running = start_server(served_tiny(chat_tokenizer(small_tokenizer)))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def schema(server) -> dict:
    r = httpx.get(f"{server.url}/openapi.json", timeout=30)
    assert r.status_code == 200
    return r.json()


def validator(schema: dict, pointer: str) -> jsonschema.Draft202012Validator:
    """A validator for one schema the document points to, resolving its $refs inside the document."""
    root = {**schema, "$ref": pointer}
    jsonschema.Draft202012Validator.check_schema(root)
    return jsonschema.Draft202012Validator(root)


def body_schema(schema: dict, path: str, method: str = "post", part: str = "request",
                media: str = "application/json") -> jsonschema.Draft202012Validator:
    operation = schema["paths"][path][method]
    holder = operation["requestBody"] if part == "request" else operation["responses"]["200"]
    return validator(schema, holder["content"][media]["schema"]["$ref"])


CHAT = {
    "model": "tiny", "messages": [{"role": "system", "content": "Be brief."},
                                  {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
    "max_completion_tokens": 4, "temperature": 0.7, "seed": 3, "n": 2, "logprobs": True, "top_logprobs": 2,
    "logit_bias": {"17": -100}, "stop": ["\n\n"],
}


def test_the_schema_lists_every_api_route_with_its_request_body(schema):
    assert schema["openapi"].startswith("3.")
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/messages", "/v1/batches",
                 "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/v1/responses", "/tokenize"):
        assert schema["paths"][path]["post"]["requestBody"]["required"] is True
    assert "/v1/models" in schema["paths"]
    chat = schema["components"]["schemas"]["ChatCompletionRequest"]
    assert {"messages", "n", "logit_bias", "top_logprobs", "tools", "response_format"} <= set(chat["properties"])


def test_real_requests_validate_and_wrong_ones_do_not(schema):
    chat = body_schema(schema, "/v1/chat/completions")
    chat.validate(CHAT)
    for wrong in ({**CHAT, "messages": [{"role": "robot", "content": "x"}]},
                  {**CHAT, "n": 0}, {**CHAT, "top_logprobs": 21}, {"model": "tiny"}):
        assert not chat.is_valid(wrong)
    completions = body_schema(schema, "/v1/completions")
    completions.validate({"model": "tiny", "prompt": [1, 2, 3], "logprobs": 3, "echo": True})
    assert not completions.is_valid({"model": "tiny", "prompt": "x", "logprobs": 6})
    completions.validate({"model": "tiny", "prompt": [1, 2, 3], "prompt_logprobs": 20})
    assert not completions.is_valid({"model": "tiny", "prompt": "x", "prompt_logprobs": 101})
    body_schema(schema, "/tokenize").validate({"model": "tiny", "prompt": "x", "add_special_tokens": False})
    assert not body_schema(schema, "/tokenize").is_valid({"model": "tiny"})
    body_schema(schema, "/v1/embeddings").validate({"model": "m", "input": ["a", "b"], "encoding_format": "base64"})
    assert not body_schema(schema, "/v1/embeddings").is_valid({"input": "a", "encoding_format": "hex"})
    body_schema(schema, "/v1/messages").validate(
        {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
    assert not body_schema(schema, "/v1/messages").is_valid({"messages": []})  # max_tokens is required


def test_real_replies_validate_against_the_response_schemas(server, schema):
    url = server.url
    reply = httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=60).json()
    body_schema(schema, "/v1/chat/completions", part="response").validate(reply)
    chunk_schema = body_schema(schema, "/v1/chat/completions", part="response", media="text/event-stream")
    streamed = httpx.post(f"{url}/v1/chat/completions", timeout=60,
                          json={**CHAT, "stream": True, "stream_options": {"include_usage": True}}).text
    events = [json.loads(b[6:]) for b in streamed.split("\n\n") if b.startswith("data: {")]
    assert len(events) > 3
    for event in events:
        chunk_schema.validate(event)
    completion = httpx.post(f"{url}/v1/completions", timeout=60,
                            json={"model": "tiny", "prompt": "Hello", "max_tokens": 3, "logprobs": 2,
                                  "prompt_logprobs": 2}).json()
    assert completion["choices"][0]["prompt_logprobs"][1]
    body_schema(schema, "/v1/completions", part="response").validate(completion)
    tokens = httpx.post(f"{url}/tokenize", json={"model": "tiny", "prompt": "Hello"}, timeout=30).json()
    body_schema(schema, "/tokenize", part="response").validate(tokens)
    models = httpx.get(f"{url}/v1/models", timeout=30).json()
    body_schema(schema, "/v1/models", method="get", part="response").validate(models)
    error = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "n": 0}, timeout=30)
    assert error.status_code == 400
    validator(schema, "#/components/schemas/ErrorBody").validate(error.json())
