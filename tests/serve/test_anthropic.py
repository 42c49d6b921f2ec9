"""POST /v1/messages through the official `anthropic` client, over the real engine and real HTTP."""

from __future__ import annotations

import anthropic
import pytest
from api_testing import served_tiny, start_server, tiny_model

from portachat.serve.api.anthropic import MessagesRequest
from portachat.serve.api.anthropic import template_messages as anthropic_messages
from portachat.serve.api.protocol import ChatCompletionRequest
from portachat.serve.api.tool_calls import template_messages as openai_messages
from tests.serve.test_tool_calls import _ours
from tests.serve.tool_templates import HERMES_TOOLS, WEATHER_TOOL


@pytest.fixture(scope="module")
def tool_tokenizer(tmp_path_factory):
    from tests.model.hf_families import save_tokenizer, train_bpe

    directory = tmp_path_factory.mktemp("anthropic_tok")
    save_tokenizer(train_bpe(), directory, chat_template=HERMES_TOOLS)
    return _ours(directory)


@pytest.fixture(scope="module")
def server(tool_tokenizer):
    running = start_server(served_tiny(tool_tokenizer, model=tiny_model(tool_tokenizer.vocab_size, seed=3)))
    yield running
    running.stop()


@pytest.fixture()
def client(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


HELLO = [{"role": "user", "content": "the quick brown fox"}]


def test_a_reply_and_its_stream_agree(client, tool_tokenizer):
    reply = client.messages.create(model="tiny", max_tokens=16, system="Be brief.", messages=HELLO,
                                   extra_body={"temperature": 0})
    assert reply.type == "message" and reply.role == "assistant" and reply.model == "tiny"
    assert reply.stop_reason in ("end_turn", "max_tokens")
    prompt = tool_tokenizer.render_prompt([{"role": "system", "content": "Be brief."}, *HELLO])
    assert reply.usage.input_tokens == len(prompt) and 1 <= reply.usage.output_tokens <= 16
    text = "".join(b.text for b in reply.content if b.type == "text")

    with client.messages.stream(model="tiny", max_tokens=16, system="Be brief.", messages=HELLO,
                                extra_body={"temperature": 0}) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text  # greedy: the same reply
    assert final.stop_reason == reply.stop_reason and final.usage.output_tokens == reply.usage.output_tokens


def test_stop_sequences_say_which_one_matched(client):
    base = client.messages.create(model="tiny", max_tokens=24, messages=HELLO,
                                  extra_body={"ignore_eos": True, "temperature": 0})
    text = base.content[0].text
    stop = next((text[i : i + 2] for i in range(3, len(text) - 2) if text[i : i + 2].strip()), None)
    assert stop is not None, f"the reply {text!r} is too short to cut"
    cut = client.messages.create(model="tiny", max_tokens=24, messages=HELLO, stop_sequences=[stop],
                                 extra_body={"ignore_eos": True, "temperature": 0})
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == text[: text.find(stop)]


def test_errors_come_in_anthropic_shape(client, server):
    import httpx

    r = httpx.post(f"{server.url}/v1/messages", json={"messages": HELLO}, timeout=30)  # no max_tokens
    assert r.status_code == 400
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="tiny", max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
    assert "image" in str(info.value)
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="other", max_tokens=8, messages=HELLO)
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model="tiny", max_tokens=8, messages=[{"role": "robot", "content": "x"}])
    for bad in ({"temperature": -0.5}, {"top_p": 0}, {"max_tokens": 0}, {"stop_sequences": [""]}):
        r = httpx.post(f"{server.url}/v1/messages", json={"model": "tiny", "max_tokens": 8, "messages": HELLO, **bad},
                       timeout=30)
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        assert next(iter(bad)).removesuffix("_sequences") in r.json()["error"]["message"]


def test_tool_use_and_results_render_as_their_openai_equivalent(tool_tokenizer):
    anthropic_side = MessagesRequest.model_validate({"max_tokens": 8, "system": "S", "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": '{"temp": 21}'}]},
    ]})
    openai_side = ChatCompletionRequest.model_validate({"messages": [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": '{"temp": 21}'},
    ]})
    ours = anthropic_messages(anthropic_side)
    theirs = openai_messages(openai_side.messages)
    render = tool_tokenizer.render_text
    assert render(ours, tools=[WEATHER_TOOL])[0] == render(theirs, tools=[WEATHER_TOOL])[0]
    assert "<tool_response>" in render(ours, tools=[WEATHER_TOOL])[0]
