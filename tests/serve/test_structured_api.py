"""Structured output over real HTTP with the official clients: response_format, vLLM's
structured_outputs and guided_* fields, enforced tool calls (OpenAI `required` / named, Anthropic
`any` / `tool`), and 400s that name what cannot be handled. A tiny random model of ours with a
Hermes tool template: whatever it would write, the reply parses and validates."""

from __future__ import annotations

import json
import re

import anthropic
import httpx
import openai
import pytest
from api_testing import served_tiny, start_server, tiny_model
from structured_testing import conforms

from tests.serve.test_tool_calls import _ours
from tests.serve.tool_templates import HERMES_TOOLS

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0, "maximum": 99},
                   "pet": {"enum": ["cat", "dog", None]}},
    "required": ["name", "age", "pet"],
    "additionalProperties": False,
}
LOOKUP = {"type": "function", "function": {"name": "lookup", "description": "Find a word", "parameters": {
    "type": "object", "properties": {"word": {"type": "string", "maxLength": 6}, "exact": {"type": "boolean"}},
    "required": ["word", "exact"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {"name": "clock", "parameters": {  # with $defs, as pydantic writes them
    "type": "object", "properties": {"zone": {"$ref": "#/$defs/Zone"}}, "required": ["zone"],
    "additionalProperties": False, "$defs": {"Zone": {"enum": ["utc", "cet"]}}}}}
HELLO = [{"role": "user", "content": "the quick brown fox"}]


@pytest.fixture(scope="module")
def tool_tokenizer(tmp_path_factory):
    from tests.model.hf_families import save_tokenizer, train_bpe

    directory = tmp_path_factory.mktemp("structured_tok")
    save_tokenizer(train_bpe(), directory, chat_template=HERMES_TOOLS)
    return _ours(directory)


@pytest.fixture(scope="module")
def server(tool_tokenizer):
    running = start_server(served_tiny(tool_tokenizer, max_model_len=1024,
                                       model=tiny_model(tool_tokenizer.vocab_size, seed=5, max_seq_len=1024)))
    yield running
    running.stop()


@pytest.fixture()
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def _chat(client, **kwargs):
    kwargs.setdefault("max_tokens", 120)
    return client.chat.completions.create(model="tiny", messages=HELLO, **kwargs)


@pytest.mark.parametrize("seed", [0, 1])
def test_json_schema_replies_validate_and_stream_the_same(client, seed):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    reply = _chat(client, response_format=fmt, temperature=1.0, seed=seed)
    assert reply.choices[0].finish_reason == "stop"
    assert conforms(json.loads(reply.choices[0].message.content), PERSON), reply.choices[0].message.content
    stream = _chat(client, response_format=fmt, temperature=1.0, seed=seed, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == reply.choices[0].message.content


def test_json_object_regex_choice_and_grammar_in_every_spelling(client):
    obj = _chat(client, response_format={"type": "json_object"}, temperature=0.8, seed=3, max_tokens=200)
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(obj.choices[0].message.content), dict)
    else:  # free-form object: a random model may run out of tokens, but never leaves the grammar
        assert obj.choices[0].message.content.startswith("{")
    pattern = r"[0-9]{3}-[a-z]{2,4}"
    for extra in ({"structured_outputs": {"regex": pattern}}, {"guided_regex": pattern}):
        text = _chat(client, temperature=0, extra_body=extra).choices[0].message.content
        assert re.fullmatch(pattern, text), (extra, text)
    for extra in ({"structured_outputs": {"choice": ["alpha", "beta gamma"]}}, {"guided_choice": ["alpha", "beta gamma"]}):
        assert _chat(client, temperature=0, extra_body=extra).choices[0].message.content in ("alpha", "beta gamma")
    grammar = 'root ::= "(" [0-9] ("+" [0-9])? ")"'
    for extra in ({"structured_outputs": {"grammar": grammar}}, {"guided_grammar": grammar}):
        assert re.fullmatch(r"\(\d(\+\d)?\)", _chat(client, temperature=0, extra_body=extra).choices[0].message.content)
    text = client.completions.create(model="tiny", prompt="once upon", max_tokens=120, temperature=0,
                                     extra_body={"guided_json": PERSON}).choices[0].text
    assert conforms(json.loads(text), PERSON)


def test_what_cannot_be_handled_is_a_400_naming_it(client, server):
    def error(**body):
        r = httpx.post(f"{server.url}/v1/chat/completions", json={"messages": HELLO, "max_tokens": 8, **body}, timeout=60)
        assert r.status_code == 400, r.text
        return r.json()["error"]

    e = error(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "not": {"required": ["a"]}}}})
    assert "not" in e["message"] and e["param"] == "response_format.json_schema.schema"
    e = error(structured_outputs={"regex": "[a-"})
    assert "regex" in e["message"] and e["param"] == "structured_outputs.regex"
    assert error(response_format={"type": "xml"})["param"] == "response_format.type"
    assert error(structured_outputs={"regex": "a", "choice": ["b"]})["param"] == "structured_outputs"
    assert error(guided_choice=[])["param"] == "guided_choice"
    assert error(response_format={"type": "json_object"}, guided_regex="a+")["param"] == "guided_regex"
    e = error(tools=[LOOKUP], tool_choice="required", response_format={"type": "json_object"})
    assert e["param"] == "tool_choice"
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "x", "max_tokens": 4,
                                                          "guided_json": {"type": "object", "not": {}}}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "guided_json"


def _check_calls(calls, allowed):
    names = {t["function"]["name"] for t in allowed}
    assert calls
    for call in calls:
        args = json.loads(call.function.arguments)
        if call.function.name == "lookup":
            assert "lookup" in names and conforms(args, LOOKUP["function"]["parameters"]), args
        else:
            assert call.function.name == "clock" and "clock" in names and args in ({"zone": "utc"}, {"zone": "cet"})


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_required_and_named_tool_choices_are_enforced(client, seed):
    reply = _chat(client, tools=[LOOKUP, CLOCK], tool_choice="required", parallel_tool_calls=False,
                  temperature=1.0, seed=seed, max_tokens=150)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    _check_calls(choice.message.tool_calls, [LOOKUP, CLOCK])
    named = _chat(client, tools=[LOOKUP, CLOCK], tool_choice={"type": "function", "function": {"name": "clock"}},
                  temperature=1.0, seed=seed)
    assert named.choices[0].finish_reason == "tool_calls"
    assert [c.function.name for c in named.choices[0].message.tool_calls] == ["clock"]
    _check_calls(named.choices[0].message.tool_calls, [CLOCK])


def test_enforced_calls_stream_as_tool_call_deltas(client):
    stream = _chat(client, tools=[LOOKUP], tool_choice={"type": "function", "function": {"name": "lookup"}},
                   temperature=0, stream=True)
    chunks = [c for c in stream if c.choices]
    heads = [d for c in chunks for d in (c.choices[0].delta.tool_calls or []) if d.id]
    args = "".join(d.function.arguments or "" for c in chunks for d in (c.choices[0].delta.tool_calls or []))
    assert [h.function.name for h in heads] == ["lookup"] and chunks[-1].choices[0].finish_reason == "tool_calls"
    assert conforms(json.loads(args), LOOKUP["function"]["parameters"])


def test_anthropic_any_and_tool_are_enforced(server):
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
    tools = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in (LOOKUP, CLOCK)]
    for choice in ({"type": "any", "disable_parallel_tool_use": True}, {"type": "tool", "name": "lookup"}):
        reply = client.messages.create(model="tiny", max_tokens=150, messages=HELLO, tools=tools, tool_choice=choice,
                                       extra_body={"temperature": 0})
        uses = [b for b in reply.content if b.type == "tool_use"]
        assert reply.stop_reason == "tool_use" and len(uses) == 1, reply
        if choice["type"] == "tool":
            assert uses[0].name == "lookup"
        schema = next(t["input_schema"] for t in tools if t["name"] == uses[0].name)
        assert conforms(uses[0].input, schema) if uses[0].name == "lookup" else uses[0].input["zone"] in ("utc", "cet")


def test_tool_choice_needs_a_template_with_a_call_format(tmp_path):
    from tests.model.hf_families import save_tokenizer, train_bpe

    save_tokenizer(train_bpe(), tmp_path)  # plain ChatML: no tool-call format
    plain = _ours(tmp_path)
    running = start_server(served_tiny(plain, model=tiny_model(plain.vocab_size)))
    try:
        r = httpx.post(f"{running.url}/v1/chat/completions", json={
            "messages": HELLO, "max_tokens": 8, "tools": [LOOKUP], "tool_choice": "required"}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
        assert "format" in r.json()["error"]["message"]
    finally:
        running.stop()


@pytest.mark.parametrize("fmt,parallel", [("hermes", True), ("hermes", False), ("llama3_json", True)])
def test_tool_call_grammars_accept_calls_and_nothing_else(tool_tokenizer, fmt, parallel):
    from portachat.engine.structured.compile import Constraints
    from portachat.serve.api.tool_calls import parse_tool_calls, tool_call_spec, tool_request

    constraints = Constraints(tool_tokenizer, tool_tokenizer.vocab_size)
    spec = tool_call_spec(tool_request([LOOKUP, CLOCK], "required", parallel), fmt)
    key = "arguments" if fmt == "hermes" else "parameters"
    calls = [{"name": "clock", key: {"zone": "utc"}}, {"name": "lookup", key: {"word": "fox", "exact": False}}]
    bodies = [json.dumps(c) for c in calls]
    text = ("\n".join(f"<tool_call>\n{b}\n</tool_call>" for b in bodies) if fmt == "hermes" else "; ".join(bodies))

    def accepts(candidate: str) -> bool:
        matcher = constraints.matcher(spec)
        return all(matcher.consume_token(t) for t in tool_tokenizer.encode(candidate)) and matcher.is_accepting()

    assert accepts(text) == parallel  # two calls only when parallel calls are allowed
    one = f"<tool_call>\n{bodies[0]}\n</tool_call>" if fmt == "hermes" else bodies[0]
    assert accepts(one) and [c.name for c in parse_tool_calls(one, fmt)[1]] == ["clock"]
    assert not accepts(one.replace('"utc"', '"pst"'))  # arguments outside the function's schema
    assert not accepts(one.replace('"clock"', '"alarm"'))  # a function that is not offered
    named = tool_call_spec(tool_request([LOOKUP, CLOCK], {"type": "function", "function": {"name": "lookup"}}, True), fmt)
    matcher = constraints.matcher(named)
    assert not all(matcher.consume_token(t) for t in tool_tokenizer.encode(one))  # only `lookup` may be called
    assert tool_call_spec(tool_request([LOOKUP], "auto", True), fmt) is None


def test_each_of_n_choices_gets_its_own_enforced_tool_call_whole_and_streamed(client):
    ask = dict(tools=[LOOKUP, CLOCK], tool_choice="required", parallel_tool_calls=False, temperature=1.0, seed=3,
               max_tokens=150, n=3)
    reply = _chat(client, **ask)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    for choice in reply.choices:
        assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
        _check_calls(choice.message.tool_calls, [LOOKUP, CLOCK])
    # Streamed, each choice's deltas reassemble into that choice's call (same seeds: same calls).
    names, args, finish = ["", "", ""], ["", "", ""], [None] * 3
    for chunk in _chat(client, stream=True, **ask):
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                names[choice.index] += delta.function.name or "" if delta.function else ""
                args[choice.index] += delta.function.arguments or "" if delta.function else ""
            finish[choice.index] = choice.finish_reason or finish[choice.index]
    assert finish == ["tool_calls"] * 3
    for choice, name, arguments in zip(reply.choices, names, args, strict=True):
        call = choice.message.tool_calls[0].function
        assert (name, json.loads(arguments)) == (call.name, json.loads(call.arguments))
