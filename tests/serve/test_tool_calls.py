"""Tool calling: requests validated, conversations with calls rendered as transformers renders them,
and the calls a model writes parsed back out (whole and streamed) into OpenAI's shape."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from portachat.serve.api.errors import APIError
from portachat.serve.api.protocol import ChatCompletionRequest
from portachat.serve.api.tool_calls import (
    StreamingToolParser,
    call_format,
    parse_tool_calls,
    template_messages,
    tool_request,
)
from portachat.tokenizer.chat_tokenizer import TemplateChatTokenizer
from tests.model.hf_families import CHATML, save_tokenizer, train_bpe
from tests.serve.tool_templates import HERMES_TOOLS, WEATHER_TOOL

ROUND_TRIP = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tools_tok")
    save_tokenizer(train_bpe(), directory, chat_template=HERMES_TOOLS)
    return directory


def _ours(directory) -> TemplateChatTokenizer:
    from tokenizers import Tokenizer

    config = json.loads((directory / "tokenizer_config.json").read_text())
    if (directory / "chat_template.jinja").exists():
        config["chat_template"] = (directory / "chat_template.jinja").read_text()
    return TemplateChatTokenizer(Tokenizer.from_file(str(directory / "tokenizer.json")), config)


def test_a_tool_round_trip_renders_as_transformers_renders_it(hf_dir):
    import transformers

    hf = transformers.AutoTokenizer.from_pretrained(str(hf_dir))
    request = ChatCompletionRequest.model_validate({"messages": ROUND_TRIP, "tools": [WEATHER_TOOL]})
    messages = template_messages(request.messages)
    assert messages[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}  # a dict, as HF expects
    expected = hf.apply_chat_template(messages, tools=[WEATHER_TOOL], add_generation_prompt=True, tokenize=False)
    assert "<tool_call>" in expected and '"get_weather"' in expected and "<tool_response>" in expected
    ours = _ours(hf_dir)
    text, _ = ours.render_text(messages, add_generation_prompt=True, tools=[WEATHER_TOOL])
    assert text == expected
    ids = hf.apply_chat_template(messages, tools=[WEATHER_TOOL], add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert ours.render_prompt(messages, tools=[WEATHER_TOOL]) == list(ids)


def test_the_format_is_read_from_the_template():
    assert call_format(HERMES_TOOLS) == "hermes"
    assert call_format(CHATML) is None
    assert call_format("{{ '<|python_tag|>' }}{{ tools }}") == "llama3_json"


def test_chat_template_override_keeps_the_tokenizer(hf_dir, tmp_path):
    save_tokenizer(train_bpe(), tmp_path)  # plain ChatML: no tools
    plain = _ours(tmp_path)
    assert not plain.takes_tools
    swapped = plain.with_chat_template(HERMES_TOOLS)
    assert swapped.takes_tools and swapped.stop_ids == plain.stop_ids
    assert "get_weather" in swapped.render_text(ROUND_TRIP[:2], tools=[WEATHER_TOOL])[0]


def test_hermes_calls_are_parsed_with_the_content_around_them():
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "北京"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>')
    content, calls = parse_tool_calls(text, "hermes")
    assert content == "Let me check."
    assert [c.name for c in calls] == ["get_weather", "get_weather"]
    assert json.loads(calls[0].arguments) == {"city": "北京"} and json.loads(calls[1].arguments)["unit"] == "c"
    assert calls[0].id != calls[1].id and calls[0].id.startswith("call_")
    # Text that is no call stays content; a broken call is left as text.
    assert parse_tool_calls("no tools here", "hermes") == ("no tools here", [])
    broken = "<tool_call>\n{not json}\n</tool_call>"
    assert parse_tool_calls(broken, "hermes") == (broken, [])
    # A reply cut at the stop token right after the call (no closing tag) still parses.
    _, calls = parse_tool_calls('<tool_call>\n{"name": "f", "arguments": {}}', "hermes")
    assert [c.name for c in calls] == ["f"]


def test_llama3_json_calls():
    _, calls = parse_tool_calls('<|python_tag|>{"name": "f", "parameters": {"x": 1}}; {"name": "g", "parameters": {}}',
                                "llama3_json")
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {"x": 1}), ("g", {})]
    assert parse_tool_calls("It is sunny.", "llama3_json") == ("It is sunny.", [])
    assert parse_tool_calls('{"city": "Paris"}', "llama3_json") == ('{"city": "Paris"}', [])  # JSON, not a call


@pytest.mark.parametrize("fmt,text", [
    ("hermes", 'Sure.<tool_call>\n{"name": "a", "arguments": {"k": "v"}}\n</tool_call>\n<tool_call>'
               '{"name": "b", "arguments": {}}</tool_call>'),
    ("hermes", "plain text with < and <tool but no call"),
    ("llama3_json", '{"name": "a", "parameters": {"k": [1, 2]}}'),
    ("llama3_json", "plain answer"),
])
def test_streamed_pieces_reassemble_into_the_whole_parse(fmt, text):
    whole_content, whole_calls = parse_tool_calls(text, fmt)
    for size in (1, 2, 3, 7, len(text)):
        parser = StreamingToolParser(fmt)
        content, calls = "", []
        for i in range(0, len(text), size):
            c, found = parser.feed(text[i : i + size])
            content, calls = content + c, calls + found
        c, found = parser.finish()
        content, calls = content + c, calls + found
        assert [(x.name, x.arguments) for x in calls] == [(x.name, x.arguments) for x in whole_calls]
        assert content.strip() == whole_content.strip()


def test_tool_requests_are_validated():
    assert tool_request(None, None, None) is None
    req = tool_request([WEATHER_TOOL], None, None)
    assert req.choice == "auto" and req.parse_calls and req.parallel
    assert not tool_request([WEATHER_TOOL], "none", None).parse_calls
    named = tool_request([WEATHER_TOOL], {"type": "function", "function": {"name": "get_weather"}}, False)
    assert named.choice == "named" and named.named == "get_weather" and not named.parallel
    bad = [
        ([{"type": "function"}], None, "tools[0]"),
        ([{"type": "function", "function": {"name": "has space"}}], None, "tools[0].function.name"),
        ([WEATHER_TOOL, WEATHER_TOOL], None, "tools"),
        ([WEATHER_TOOL], {"type": "function", "function": {"name": "nope"}}, "tool_choice"),
        ([WEATHER_TOOL], "sometimes", "tool_choice"),
        (None, "required", "tool_choice"),
    ]
    for tools, choice, param in bad:
        with pytest.raises(APIError) as info:
            tool_request(tools, choice, None)
        assert info.value.status == 400 and info.value.param == param


def test_tool_messages_need_valid_arguments():
    msg = SimpleNamespace(role="assistant", text=lambda: "", name=None, tool_call_id=None,
                          tool_calls=[{"id": "c", "function": {"name": "f", "arguments": "{oops"}}])
    with pytest.raises(APIError) as info:
        template_messages([msg])
    assert info.value.status == 400
