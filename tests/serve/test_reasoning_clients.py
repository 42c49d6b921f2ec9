"""Reasoning and answer arrive apart in all three APIs, whole and streamed, from a tiny model of ours
trained in the test to write `<think>…</think>` before its answer (thinking_model.py); with the
template's `enable_thinking` off (chat_template_kwargs, Anthropic's `thinking: disabled`) there is no
reasoning at all."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
from api_testing import served_tiny, start_server
from thinking_model import ANSWER, REASONING, thinking_tokenizer, train_thinking_model

pytestmark = pytest.mark.slow

OFF = {"chat_template_kwargs": {"enable_thinking": False}}
QUESTION = [{"role": "user", "content": "jolly gnomes"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    patch = pytest.MonkeyPatch()
    patch.setenv("PORTACHAT_HOME", str(tmp_path_factory.mktemp("home")))
    tok = thinking_tokenizer(tmp_path_factory.mktemp("thinking_tok"))
    running = start_server(served_tiny(tok, model=train_thinking_model(tok, steps=100)))
    yield running
    running.stop()
    patch.undo()


def test_chat_completions_anthropic_and_responses_split_reasoning_from_the_answer(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120)
    reply = client.chat.completions.create(model="tiny", messages=QUESTION, temperature=0, max_tokens=40)
    message = reply.choices[0].message
    assert message.content == ANSWER
    assert message.model_extra["reasoning_content"] == message.model_extra["reasoning"] == REASONING

    reasoning, content = "", ""
    for chunk in client.chat.completions.create(model="tiny", messages=QUESTION, temperature=0, max_tokens=40,
                                                stream=True):
        delta = chunk.choices[0].delta if chunk.choices else None
        reasoning += (delta.model_extra or {}).get("reasoning_content") or "" if delta else ""
        content += delta.content or "" if delta else ""
    assert (reasoning, content) == (REASONING, ANSWER)

    # A JSON schema holds the answer, not the reasoning: the model still thinks first.
    schema = {"type": "object", "properties": {"word": {"enum": ["hello", "there"]}}, "required": ["word"],
              "additionalProperties": False}
    shaped = client.chat.completions.create(model="tiny", messages=QUESTION, temperature=0, max_tokens=40,
                                            response_format={"type": "json_schema", "json_schema": {
                                                "name": "word", "schema": schema}}).choices[0].message
    assert shaped.model_extra["reasoning_content"] == REASONING
    assert json.loads(shaped.content)["word"] in ("hello", "there")

    plain = client.chat.completions.create(model="tiny", messages=QUESTION, temperature=0, max_tokens=40,
                                           extra_body=OFF).choices[0].message
    assert plain.content == ANSWER and "reasoning_content" not in (plain.model_extra or {})

    claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=120)
    greedy = {"temperature": 0}  # (this SDK takes temperature only as an extra field)
    answer = claude.messages.create(model="tiny", messages=QUESTION, max_tokens=40, extra_body=greedy)
    assert [b.type for b in answer.content] == ["thinking", "text"]
    assert (answer.content[0].thinking, answer.content[1].text) == (REASONING, ANSWER)
    with claude.messages.stream(model="tiny", messages=QUESTION, max_tokens=40, extra_body=greedy) as stream:
        kinds = {event.type for event in stream}
        streamed = stream.get_final_message()
    assert "thinking" in kinds and [b.type for b in streamed.content] == ["thinking", "text"]
    assert (streamed.content[0].thinking, streamed.content[1].text) == (REASONING, ANSWER)
    off = claude.messages.create(model="tiny", messages=QUESTION, max_tokens=40, extra_body=greedy,
                                 thinking={"type": "disabled"})
    assert [b.type for b in off.content] == ["text"] and off.content[0].text == ANSWER

    response = client.responses.create(model="tiny", input="jolly gnomes", temperature=0, max_output_tokens=40)
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.output[0].content[0].text == REASONING and response.output_text == ANSWER
    assert response.usage.output_tokens_details.reasoning_tokens > 0
    with client.responses.stream(model="tiny", input="jolly gnomes", temperature=0, max_output_tokens=40) as stream:
        deltas = [e.delta for e in stream if e.type == "response.reasoning_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == REASONING and final.output_text == ANSWER
    assert final.output[0].type == "reasoning"
