"""More of the OpenAI surface over the real engine and real HTTP: n > 1, top_logprobs, logit_bias."""

from __future__ import annotations

import json
import math

import httpx
import openai
import pytest
import torch
from api_testing import chat_tokenizer, served_tiny, start_server, tiny_model


@pytest.fixture(scope="module")
def tok(small_tokenizer):
    return chat_tokenizer(small_tokenizer)


@pytest.fixture(scope="module")
def model(tok):
    return tiny_model(tok.vocab_size)


@pytest.fixture(scope="module")
def served(tok, model):
    return served_tiny(tok, model=model)


@pytest.fixture(scope="module")
def server(served):
    running = start_server(served)
    yield running
    running.stop()


@pytest.fixture()
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def messages(topic: str) -> list[dict]:
    """A prompt of several KV blocks (16 tokens each), unique per test so the prefix cache starts cold."""
    return [{"role": "user", "content": f"Tell me a long story about {topic}, " + "with many details " * 8}]


def greedy_reference(model, prompt: list[int], steps: int, k: int) -> list[tuple[int, list[tuple[int, float]]]]:
    """(argmax token, its k likeliest (id, logprob)) per step, by full fp32 forwards without a cache."""
    ids, out = list(prompt), []
    with torch.no_grad():
        for _ in range(steps):
            logprobs = torch.log_softmax(model(torch.tensor([ids]))[0, -1].float(), dim=-1)
            values, top = torch.topk(logprobs, k)
            out.append((int(top[0]), list(zip(top.tolist(), values.tolist(), strict=True))))
            ids.append(int(top[0]))
    return out


# ------------------------------------------------------------------------------------------ n > 1


def test_n_greedy_gives_identical_choices_and_shares_the_prompt_blocks(client, served, tok):
    msgs = messages("greedy lighthouses")
    prompt_len = len(tok.render_prompt(msgs))
    full_blocks = (prompt_len - 1) // 16
    assert full_blocks >= 3
    before = served.engine.stats()["prefix_cache_hits"]
    reply = client.chat.completions.create(model="tiny", messages=msgs, n=3, max_tokens=8, temperature=0,
                                           extra_body={"ignore_eos": True})
    hits = served.engine.stats()["prefix_cache_hits"] - before
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert len({c.message.content for c in reply.choices}) == 1
    assert reply.usage.prompt_tokens == prompt_len  # the prompt counts once
    assert reply.usage.completion_tokens == 3 * 8
    # The second and third choices took every full prompt block from the first one's prefill.
    assert hits == 2 * full_blocks


def test_n_sampled_with_a_seed_is_reproducible_and_each_choice_is_seed_plus_index(client):
    msgs = messages("seeded rivers")
    ask = dict(model="tiny", messages=msgs, max_tokens=16, temperature=1.0, extra_body={"ignore_eos": True})
    first = client.chat.completions.create(n=3, seed=7, **ask)
    again = client.chat.completions.create(n=3, seed=7, **ask)
    texts = [c.message.content for c in first.choices]
    assert texts == [c.message.content for c in again.choices]
    assert len(set(texts)) == 3
    single = client.chat.completions.create(n=1, seed=8, **ask)
    assert single.choices[0].message.content == texts[1]


def test_n_streamed_chunks_carry_each_choice_index(client):
    msgs = messages("streamed mountains")
    ask = dict(model="tiny", messages=msgs, max_tokens=10, temperature=0.8, seed=3, n=3,
               extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**ask)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **ask))
    texts, finished, roles = ["", "", ""], [None] * 3, set()
    for c in chunks:
        for choice in c.choices:
            texts[choice.index] += choice.delta.content or ""
            finished[choice.index] = choice.finish_reason or finished[choice.index]
            if choice.delta.role:
                roles.add(choice.index)
    assert texts == [c.message.content for c in whole.choices]
    assert finished == ["length"] * 3 and roles == {0, 1, 2}
    assert chunks[-1].usage.completion_tokens == 30 and chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_n_on_completions_streamed_and_not(client):
    ask = dict(model="tiny", prompt="Once upon a time " * 6, max_tokens=6, temperature=0.9, seed=11, n=2,
               extra_body={"ignore_eos": True})
    whole = client.completions.create(**ask)
    assert [c.index for c in whole.choices] == [0, 1] and whole.usage.completion_tokens == 12
    texts = ["", ""]
    for chunk in client.completions.create(stream=True, **ask):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert texts == [c.text for c in whole.choices]


def test_n_with_structured_output_constrains_every_choice(client):
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"],
              "additionalProperties": False}
    reply = client.chat.completions.create(
        model="tiny", messages=messages("json"), n=3, max_tokens=40, temperature=1.0, seed=5,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    for choice in reply.choices:
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.message.content)["x"], int)
    assert any(c.finish_reason == "stop" for c in reply.choices)


# ------------------------------------------------------------------------------------------ logprobs


def test_chat_top_logprobs_match_a_plain_forward(client, model, tok):
    msgs = messages("logprob owls")
    reply = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0,
                                           logprobs=True, top_logprobs=5, extra_body={"ignore_eos": True})
    content = reply.choices[0].logprobs.content
    reference = greedy_reference(model, tok.render_prompt(msgs), 6, 5)
    assert len(content) == 6
    for got, (token, top) in zip(content, reference, strict=True):
        assert got.bytes == list(tok.token_bytes(token))
        values = [alt.logprob for alt in got.top_logprobs]
        assert values == sorted(values, reverse=True) and len(values) == 5
        assert got.top_logprobs[0].bytes == got.bytes and got.top_logprobs[0].logprob == got.logprob  # greedy
        for alt, (alt_id, alt_lp) in zip(got.top_logprobs, top, strict=True):
            assert alt.bytes == list(tok.token_bytes(alt_id))
            assert abs(alt.logprob - alt_lp) < 1e-4


def test_chat_top_logprobs_streamed_equal_the_whole_reply(client):
    ask = dict(model="tiny", messages=messages("streamed owls"), max_tokens=5, temperature=0, logprobs=True,
               top_logprobs=3, extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**ask).choices[0].logprobs.content
    streamed = [entry for chunk in client.chat.completions.create(stream=True, **ask)
                for choice in chunk.choices if choice.logprobs for entry in choice.logprobs.content]
    assert [[(a.bytes, a.logprob) for a in e.top_logprobs] for e in streamed] == \
        [[(a.bytes, a.logprob) for a in e.top_logprobs] for e in whole]


def test_completions_logprobs_k_gives_top_alternatives(client, model, tok):
    prompt = tok.encode("The weather today is")
    reply = client.completions.create(model="tiny", prompt=prompt, max_tokens=4, temperature=0, logprobs=3,
                                      extra_body={"ignore_eos": True})
    lp = reply.choices[0].logprobs
    reference = greedy_reference(model, prompt, 4, 3)
    assert len(lp.top_logprobs) == 4
    for text, chosen, step, (token, top) in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, reference,
                                                 strict=True):
        raw = tok.token_bytes(token)
        assert text == (raw.decode() if raw.isascii() else text)  # a split character shows as "bytes:\x.."
        assert max(step.values()) == pytest.approx(chosen, abs=1e-6)
        # Distinct ids may share a text; every shown value is one of the reference's top 3.
        for value in step.values():
            assert any(abs(value - ref) < 1e-4 for _, ref in top)
    plain = client.completions.create(model="tiny", prompt=prompt, max_tokens=2, temperature=0, logprobs=0)
    assert plain.choices[0].logprobs.top_logprobs is None


# ------------------------------------------------------------------------------------------ logit_bias


def test_logit_bias_forces_and_bans_tokens_greedy_and_sampled(client, tok):
    prompt = tok.encode("A short line of text")
    ask = dict(model="tiny", prompt=prompt, max_tokens=5, logprobs=0, extra_body={"ignore_eos": True})
    forced = tok.encode(" zebra")[0]
    for temperature in (0.0, 1.0):
        reply = client.completions.create(temperature=temperature, seed=1, logit_bias={str(forced): 100}, **ask)
        assert reply.choices[0].logprobs.tokens == [tok.token_bytes(forced).decode()] * 5
    greedy = client.completions.create(temperature=0, **ask).choices[0].logprobs.tokens
    banned = {str(t): -100 for t in tok.encode(greedy[0])}
    again = client.completions.create(temperature=0, logit_bias=banned, **ask).choices[0].logprobs.tokens
    assert again[0] != greedy[0]
    # The reported logprobs stay the model's own: the forced token is not certain under the model.
    forced_reply = client.completions.create(temperature=0, logit_bias={str(forced): 100}, **ask)
    assert forced_reply.choices[0].logprobs.token_logprobs[0] < math.log(0.5)


def test_logit_bias_on_chat(client, tok):
    forced = tok.encode(" zebra")[0]
    reply = client.chat.completions.create(model="tiny", messages=messages("bias"), max_tokens=3, temperature=0,
                                           logit_bias={str(forced): 100}, extra_body={"ignore_eos": True})
    assert reply.choices[0].message.content == tok.token_bytes(forced).decode() * 3


@pytest.mark.parametrize("route,extra,param", [
    ("chat", {"logit_bias": {"abc": 1}}, "logit_bias"),
    ("chat", {"logit_bias": {"5": 101}}, "logit_bias"),
    ("chat", {"logit_bias": {"99999999": 1}}, "logit_bias"),
    ("completions", {"logit_bias": {"5": -100.5}}, "logit_bias"),
    ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("chat", {"top_logprobs": 2}, "top_logprobs"),
    ("completions", {"logprobs": 6}, "logprobs"),
    ("completions", {"n": 2, "best_of": 3}, "best_of"),
    ("chat", {"n": 0}, "n"),
    # the one sampling check (engine/sampling_params.py) behind every interface
    ("chat", {"temperature": 2.5}, "temperature"),
    ("completions", {"top_p": 0}, "top_p"),
    ("completions", {"top_k": -2}, "top_k"),
    ("chat", {"max_completion_tokens": 0}, "max_completion_tokens"),
    ("completions", {"max_tokens": -1}, "max_tokens"),
    ("chat", {"stop": ["", "x"]}, "stop"),
    ("completions", {"seed": 2**64}, "seed"),
    ("chat", {"repetition_penalty": 0}, "repetition_penalty"),
    ("chat", {"presence_penalty": 2.5}, "presence_penalty"),
    ("completions", {"stop_token_ids": [99999999]}, "stop_token_ids"),
])
def test_bad_sampling_fields_get_400_naming_the_field(server, route, extra, param):
    if route == "chat":
        url, body = "/v1/chat/completions", {"model": "tiny", "messages": messages("errors"), "max_tokens": 2}
    else:
        url, body = "/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 2}
    r = httpx.post(server.url + url, json={**body, **extra}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_max_completion_tokens_is_honoured_on_chat(client):
    for stream in (False, True):
        reply = client.chat.completions.create(model="tiny", messages=messages("limits"), max_completion_tokens=3,
                                               max_tokens=9, temperature=0, n=2, stream=stream,
                                               extra_body={"ignore_eos": True},
                                               **({"stream_options": {"include_usage": True}} if stream else {}))
        if stream:
            chunks = list(reply)
            assert chunks[-1].usage.completion_tokens == 6
            assert sorted(c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason) == [0, 1]
        else:
            assert reply.usage.completion_tokens == 6 and {c.finish_reason for c in reply.choices} == {"length"}


def test_unset_fields_take_the_models_generation_config_then_openais_defaults():
    from types import SimpleNamespace

    from portachat.model.load import GenerationDefaults
    from portachat.serve.api.protocol import ChatCompletionRequest
    from portachat.serve.api.request_params import sampling_params
    from portachat.serve.api.state import ServerSettings

    def params(defaults: GenerationDefaults, max_tokens_default: int | None = None, **fields):
        model = SimpleNamespace(max_model_len=64, tokenizer=SimpleNamespace(vocab_size=100), generation_defaults=defaults)
        req = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}], **fields})
        lease = SimpleNamespace(model=model, adapter=None, settings=ServerSettings(max_tokens_default=max_tokens_default))
        return sampling_params(lease, req, 10, "messages")

    authors = GenerationDefaults(temperature=0.3, top_p=0.9, top_k=40, repetition_penalty=1.1)
    got = params(authors)
    assert (got.temperature, got.top_p, got.top_k, got.repetition_penalty, got.max_tokens) == (0.3, 0.9, 40, 1.1, 54)
    got = params(authors, temperature=0.8, top_k=-1, max_tokens=5)
    assert (got.temperature, got.top_p, got.top_k, got.max_tokens) == (0.8, 0.9, 0, 5)
    got = params(GenerationDefaults())
    assert (got.temperature, got.top_p, got.top_k, got.repetition_penalty) == (1.0, 1.0, 0, 1.0)
    # A default for an unset max_tokens (`portachat generate --max-tokens`) is capped at the room left.
    assert [params(authors, default).max_tokens for default in (20, 100)] == [20, 54]
    assert params(authors, 20, max_tokens=30).max_tokens == 30
