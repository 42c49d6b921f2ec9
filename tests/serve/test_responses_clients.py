"""The Responses API against a real server, driven by the clients apps use: openai's
`responses.create` / `responses.stream` / `responses.parse`, stored responses chained with
previous_response_id, and the OpenAI Agents SDK running an agent whose one function tool is called
and answered. A tiny random model of ours with a Hermes tool template: the server's grammars make
whatever it writes parse (the tool call when tool_choice is "required", the JSON of text.format)."""

from __future__ import annotations

import json
from typing import Literal

import openai
import pytest
from api_testing import served_tiny, start_server, tiny_model
from pydantic import BaseModel, ConfigDict, Field

from tests.serve.test_tool_calls import _ours
from tests.serve.tool_templates import HERMES_TOOLS

pytestmark = pytest.mark.slow


class Pet(BaseModel):
    model_config = ConfigDict(extra="forbid")  # no extra keys: a random model would add keys until max_tokens

    name: str = Field(max_length=8)
    kind: Literal["cat", "dog"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tests.model.hf_families import save_tokenizer, train_bpe

    patch = pytest.MonkeyPatch()
    patch.setenv("PORTACHAT_HOME", str(tmp_path_factory.mktemp("home")))
    directory = tmp_path_factory.mktemp("responses_tok")
    save_tokenizer(train_bpe(), directory, chat_template=HERMES_TOOLS)
    tok = _ours(directory)
    running = start_server(served_tiny(tok, max_model_len=1024, model=tiny_model(tok.vocab_size, seed=7,
                                                                                  max_seq_len=1024)))
    yield running
    running.stop()
    patch.undo()


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120)


def test_openai_client_creates_streams_parses_chains_and_deletes_responses(server):
    client = _client(server)
    first = client.responses.create(model="tiny", instructions="Be brief.", input="the quick brown fox",
                                    max_output_tokens=12, temperature=0)
    assert first.status in ("completed", "incomplete") and first.output[0].type == "message"
    assert isinstance(first.output_text, str) and 0 < first.usage.output_tokens <= 12
    assert first.usage.input_tokens > 0 and first.usage.total_tokens == first.usage.input_tokens + first.usage.output_tokens
    assert client.responses.retrieve(first.id).output_text == first.output_text
    (item,) = client.responses.input_items.list(first.id).data
    assert item.role == "user" and item.content[0].text == "the quick brown fox"

    second = client.responses.create(model="tiny", input="and then?", previous_response_id=first.id,
                                     max_output_tokens=12, temperature=0)
    assert second.previous_response_id == first.id
    # The history reached the model: its prompt holds the first turn, its reply and the new input.
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert [i.content[0].text for i in client.responses.input_items.list(second.id).data] == ["and then?"]

    with client.responses.stream(model="tiny", input="the quick brown fox", instructions="Be brief.",
                                 max_output_tokens=12, temperature=0) as stream:
        kinds, deltas = [], []
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
            # A reply cut by max_output_tokens ends with response.incomplete, as OpenAI's does (and
            # then the SDK's get_final_response() has none): read the last event's response.
            streamed = getattr(event, "response", None)
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
    assert "response.output_text.delta" in kinds and "response.output_item.done" in kinds
    assert "".join(deltas) == streamed.output_text == first.output_text  # greedy: the same reply either way
    assert client.responses.retrieve(streamed.id).output_text == streamed.output_text

    parsed = client.responses.parse(model="tiny", input="Describe a pet.", text_format=Pet, max_output_tokens=200,
                                    temperature=0, store=False)
    assert isinstance(parsed.output_parsed, Pet) and parsed.output_parsed.kind in ("cat", "dog")
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(parsed.id)  # store: false

    weather = {"type": "function", "name": "weather", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["paris", "rome"]}}, "required": ["city"],
        "additionalProperties": False}}
    with client.responses.stream(model="tiny", input="Weather in Paris?", tools=[weather], tool_choice="required",
                                 parallel_tool_calls=False, max_output_tokens=100, temperature=0) as stream:
        kinds = [event.type for event in stream]
        called = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds and kinds[-1] == "response.completed"
    (call,) = [item for item in called.output if item.type == "function_call"]
    assert call.name == "weather" and json.loads(call.arguments)["city"] in ("paris", "rome")

    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="tiny", input="hi", previous_response_id=first.id, max_output_tokens=4)


def test_an_agents_sdk_agent_calls_its_function_tool_and_answers(server):
    from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
    from agents.items import ToolCallItem, ToolCallOutputItem
    from agents.models.openai_responses import OpenAIResponsesModel

    set_tracing_disabled(True)
    asked: list[str] = []

    @function_tool
    def weather(city: Literal["paris", "rome"]) -> str:
        """Today's weather in a city."""
        asked.append(city)
        return f"sunny in {city}"

    class Forecast(BaseModel):
        sky: Literal["sunny", "rainy"]

    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120)
    # tool_choice "required" makes the tiny model call the tool (the server enforces the call); the SDK
    # then resets the choice, and the second turn, given the tool's output, answers with the agent's
    # output type (text.format, enforced too: a random model's free text would run to max_tokens).
    agent = Agent(name="forecaster", instructions="Answer with the weather.", tools=[weather], output_type=Forecast,
                  model=OpenAIResponsesModel(model="tiny", openai_client=client),
                  model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, max_tokens=200,
                                               temperature=0))
    result = Runner.run_sync(agent, "Weather in Paris?", max_turns=4)
    assert asked and asked[0] in ("paris", "rome")
    kinds = [type(item) for item in result.new_items]
    assert ToolCallItem in kinds and ToolCallOutputItem in kinds
    output = next(item for item in result.new_items if isinstance(item, ToolCallOutputItem))
    assert output.output == f"sunny in {asked[0]}"
    assert isinstance(result.final_output, Forecast)
    assert len(result.raw_responses) == 2  # the call, then the answer that read its output
