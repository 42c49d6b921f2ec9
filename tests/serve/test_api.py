"""The OpenAI-compatible server over the real engine (tiny random model, our tokenizer), on real HTTP."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
import torch
from api_testing import chat_tokenizer, metric, served_tiny, start_server, wait_idle


@pytest.fixture(scope="module")
def tok(small_tokenizer):
    return chat_tokenizer(small_tokenizer)


@pytest.fixture(scope="module")
def server(tok):
    running = start_server(served_tiny(tok))
    yield running
    running.stop()


@pytest.fixture()
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


HELLO = [{"role": "user", "content": "Hello there, good sir"}]


def sse_payloads(response: httpx.Response) -> list:
    """The `data:` payloads of an SSE body, parsed; "[DONE]" kept as a string."""
    out = []
    for block in response.text.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_chat_with_the_openai_client_stream_and_not(client, tok):
    reply = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=12, temperature=0)
    choice = reply.choices[0]
    assert reply.object == "chat.completion" and reply.model == "tiny"
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    prompt_len = len(tok.render_prompt(HELLO))
    assert reply.usage.prompt_tokens == prompt_len
    assert 1 <= reply.usage.completion_tokens <= 12
    assert reply.usage.total_tokens == prompt_len + reply.usage.completion_tokens

    stream = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=12, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content  # greedy: the stream is the same reply
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [choice.finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == reply.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_sampled_stream_equals_unstreamed_reply_for_the_same_seed(client):
    args = dict(model="tiny", messages=HELLO, max_tokens=20, temperature=1.0, seed=1234)
    whole = client.chat.completions.create(**args).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**args, stream=True)
                       if c.choices)
    assert streamed == whole
    other = client.chat.completions.create(**{**args, "seed": 99}).choices[0].message.content
    assert other != whole  # the seed matters (a random model over 384 tokens: 20 equal draws is no chance)


def test_completions_stream_and_not(client, tok):
    reply = client.completions.create(model="tiny", prompt="To be or not", max_tokens=8, temperature=0,
                                      logprobs=0)
    assert reply.object == "text_completion"
    assert reply.usage.prompt_tokens == len(tok.encode("To be or not"))
    assert reply.usage.completion_tokens == 8 and reply.choices[0].finish_reason == "length"
    assert len(reply.choices[0].logprobs.token_logprobs) == 8
    assert all(lp <= 0 for lp in reply.choices[0].logprobs.token_logprobs)
    chunks = list(client.completions.create(model="tiny", prompt="To be or not", max_tokens=8, temperature=0,
                                            stream=True))
    assert "".join(c.choices[0].text for c in chunks) == reply.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    echoed = client.completions.create(model="tiny", prompt="To be or not", max_tokens=8, temperature=0, echo=True)
    assert echoed.choices[0].text == "To be or not" + reply.choices[0].text
    # Token ids as the prompt give the same completion.
    by_ids = client.completions.create(model="tiny", prompt=tok.encode("To be or not"), max_tokens=8, temperature=0)
    assert by_ids.choices[0].text == reply.choices[0].text


def test_stop_strings_and_chat_logprobs(client, tok):
    args = dict(model="tiny", messages=HELLO, max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    full = client.chat.completions.create(**args)
    text = full.choices[0].message.content
    assert full.choices[0].finish_reason == "length" and len(text) > 8
    stop = text[4:7]
    cut = client.chat.completions.create(**args, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[:text.index(stop)]

    reply = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=6, temperature=0, logprobs=True,
                                           extra_body={"ignore_eos": True})
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens == 6
    assert all(item.logprob <= 0 and item.bytes is not None for item in content)
    # Greedy picks the most likely token, so its log-probability is at least log(1/vocab).
    assert all(item.logprob >= -torch.log(torch.tensor(float(tok.vocab_size))).item() for item in content)
    streamed = [c for c in client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=6, temperature=0,
                                                          logprobs=True, stream=True, extra_body={"ignore_eos": True})
                if c.choices and c.choices[0].logprobs]
    assert [i.logprob for c in streamed for i in c.choices[0].logprobs.content] == pytest.approx(
        [i.logprob for i in content], abs=1e-4)


def test_raw_sse_format(server):
    body = {"model": "tiny", "messages": HELLO, "max_tokens": 4, "temperature": 0, "stream": True}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    payloads = sse_payloads(r)
    assert payloads[-1] == "[DONE]"
    assert all(p["object"] == "chat.completion.chunk" and p["id"] == payloads[0]["id"] for p in payloads[:-1])
    assert "usage" not in payloads[0]  # only with stream_options.include_usage


def test_models_health_metrics(server, client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    before = metric(server.url, "portachat:request_success_total")
    client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=5, temperature=0)
    assert metric(server.url, "portachat:request_success_total") == before + 1
    assert metric(server.url, "portachat:generation_tokens_total") > 0
    assert metric(server.url, "portachat:time_to_first_token_seconds_count") > 0
    assert metric(server.url, "portachat:e2e_request_latency_seconds_count") > 0
    wait_idle(server.url)


def assert_error(r: httpx.Response, status: int, param: str | None = None, words: tuple[str, ...] = ()) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    for word in words:
        assert word in error["message"], error["message"]
    return error


@pytest.mark.parametrize("body,param,words", [
    ({"model": "tiny", "messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role", ("robot",)),
    ({"model": "tiny", "messages": []}, "messages", ("empty",)),
    ({"model": "tiny"}, "messages", ("Missing",)),
    ({"model": "tiny", "messages": HELLO, "max_tokens": 100_000}, "max_tokens", ("maximum context length is 256",)),
    ({"model": "tiny", "messages": HELLO, "max_completion_tokens": 300}, "max_completion_tokens", ("256",)),
    ({"model": "tiny", "messages": HELLO, "temperature": 3}, "temperature", ("temperature",)),
    ({"model": "tiny", "messages": HELLO, "n": 17}, "n", ("16",)),
    ({"model": "tiny", "messages": [{"role": "user", "content": "x " * 400}]}, "messages", ("256",)),
    ({"model": "tiny", "messages": HELLO, "stream_options": {"include_usage": True}}, "stream_options", ()),
])
def test_bad_chat_requests_get_openai_errors(server, body, param, words):
    assert_error(httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30), 400, param, words)


def test_malformed_json_and_non_object(server):
    r = httpx.post(f"{server.url}/v1/chat/completions", content=b'{"model": "tiny", "messages": [',
                   headers={"content-type": "application/json"})
    assert_error(r, 400, None, ("not valid JSON",))
    assert_error(httpx.post(f"{server.url}/v1/completions", json=[1, 2]), 400, None, ("JSON object",))


def test_unknown_model_route_and_method(server, client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-4", messages=HELLO, max_tokens=2)
    assert caught.value.body["code"] == "model_not_found" and "tiny" in caught.value.body["message"]
    assert_error(httpx.get(f"{server.url}/v2/nothing"), 404, None, ("/v1/chat/completions",))
    assert_error(httpx.get(f"{server.url}/v1/chat/completions"), 405)


def test_body_over_the_limit_gets_413_and_the_server_goes_on(server, client):
    big = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "a" * 10_000_000}]}).encode()
    r = httpx.post(f"{server.url}/v1/chat/completions", content=big, headers={"content-type": "application/json"},
                   timeout=60)
    assert_error(r, 413, None, ("--max-body-bytes",))

    def chunked():  # no Content-Length: the limit must count streamed bytes too
        for i in range(0, len(big), 65536):
            yield big[i:i + 65536]

    r = httpx.post(f"{server.url}/v1/chat/completions", content=chunked(), headers={"content-type": "application/json"},
                   timeout=60)
    assert_error(r, 413)
    assert client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=2).choices[0].message is not None


def test_openai_client_sees_bad_request(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=10_000)
    assert caught.value.body["param"] == "max_tokens"
    assert caught.value.body["code"] == "context_length_exceeded"


def test_client_disconnect_mid_stream_frees_everything(tok):
    server = start_server(served_tiny(tok, max_model_len=2048))
    try:
        body = {"model": "tiny", "messages": HELLO, "max_tokens": 2000, "temperature": 1.0, "ignore_eos": True,
                "stream": True}
        aborted = 'portachat:request_success_total{finished_reason="abort",model_name="tiny"}'
        for _ in range(4):
            with httpx.Client(timeout=30) as c, c.stream("POST", f"{server.url}/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                lines = r.iter_lines()
                next(lines)  # the role chunk
                next(lines)
                # Leaving the block closes the connection mid-stream.
        wait_idle(server.url)
        assert metric(server.url, aborted) == 4

        async def hang_up_unstreamed() -> None:
            async with httpx.AsyncClient(timeout=60) as c:
                task = asyncio.create_task(c.post(f"{server.url}/v1/chat/completions", json={**body, "stream": False}))
                while metric(server.url, "portachat:num_requests_running") < 1:
                    await asyncio.sleep(0.01)
                task.cancel()  # the connection closes with the request half-done

        asyncio.run(hang_up_unstreamed())
        wait_idle(server.url)
        assert metric(server.url, aborted) == 5
        assert metric(server.url, "portachat:request_success_total") == 5  # nothing ran to its end
    finally:
        server.stop()
