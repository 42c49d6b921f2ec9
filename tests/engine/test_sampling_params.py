"""The one sampling mapper: request > the model's generation_config > the interface's fallback, field
by field; each interface's fallback; one check, whose error names the bad field."""

from __future__ import annotations

import pytest

from portachat.engine.sampling_params import (
    SamplingError,
    SamplingFallback,
    check_params,
    from_request,
    with_fields,
)
from portachat.engine.types import SamplingParams
from portachat.model.load import GenerationDefaults
from portachat.serve.fallbacks import CHAT_FALLBACK, GENERATE_FALLBACK, OPENAI_FALLBACK

MODEL = GenerationDefaults(do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)
FALLBACK = SamplingFallback(temperature=0.3, max_tokens=99, top_p=0.9, top_k=7, repetition_penalty=1.2)
REQUEST = {"temperature": 1.5, "top_p": 0.5, "top_k": 3, "repetition_penalty": 1.3, "max_tokens": 11}


@pytest.mark.parametrize("name", ["temperature", "top_p", "top_k", "repetition_penalty"])
def test_request_beats_model_beats_fallback(name):
    assert getattr(from_request(REQUEST, MODEL, FALLBACK), name) == REQUEST[name]
    assert getattr(from_request({}, MODEL, FALLBACK), name) == getattr(MODEL, name)
    assert getattr(from_request({name: None}, MODEL, FALLBACK), name) == getattr(MODEL, name)
    assert getattr(from_request({}, GenerationDefaults(), FALLBACK), name) == getattr(FALLBACK, name)
    assert getattr(from_request({}, None, FALLBACK), name) == getattr(FALLBACK, name)


def test_max_tokens_comes_from_the_request_else_the_fallback_never_the_model():
    model = GenerationDefaults(max_new_tokens=5)
    assert from_request({"max_tokens": 11}, model, FALLBACK).max_tokens == 11
    assert from_request({}, model, FALLBACK).max_tokens == 99


def test_greedy_authors_make_temperature_zero_unless_the_request_sets_it():
    greedy = GenerationDefaults(do_sample=False, temperature=0.7)
    assert from_request({}, greedy, OPENAI_FALLBACK).temperature == 0.0
    assert from_request({"temperature": 0.4}, greedy, OPENAI_FALLBACK).temperature == 0.4


def test_each_interface_has_its_own_fallback():
    unset = GenerationDefaults()
    assert from_request({"max_tokens": 8}, unset, OPENAI_FALLBACK).temperature == 1.0
    chat = from_request({}, unset, CHAT_FALLBACK)
    generate = from_request({}, unset, GENERATE_FALLBACK)
    assert (chat.temperature, chat.max_tokens) == (0.6, 512)
    assert (generate.temperature, generate.max_tokens) == (0.0, 256)
    for params in (chat, generate):
        assert (params.top_p, params.top_k, params.repetition_penalty) == (1.0, 0, 1.0)


def test_spellings_callers_send():
    params = from_request({"stop": "END", "top_k": -1}, MODEL, FALLBACK)
    assert params.stop == ["END"] and params.top_k == 0  # one stop string; vLLM's -1 = off
    assert from_request({}, GenerationDefaults(top_k=-1), FALLBACK).top_k == 0


@pytest.mark.parametrize("field,value", [
    ("max_tokens", 0), ("max_tokens", 2.5), ("max_tokens", True),
    ("temperature", -0.1), ("temperature", 2.5), ("temperature", "hot"), ("temperature", float("nan")),
    ("top_p", 0.0), ("top_p", 1.5),
    ("top_k", -2), ("top_k", 1.5),
    ("seed", 2**64), ("seed", -(2**63) - 1), ("seed", "7"),
    ("repetition_penalty", 0.0),
    ("presence_penalty", 2.5), ("frequency_penalty", -3),
    ("stop", [""]), ("stop", [3]),
    ("stop_token_ids", [-1]),
    ("top_logprobs", 21),
    ("logit_bias", {5: 101.0}), ("logit_bias", {"5": 1.0}),
    ("ignore_eos", "yes"), ("logprobs", 1),
])
def test_one_check_names_the_bad_field(field, value):
    with pytest.raises(SamplingError) as err:
        from_request({field: value}, MODEL, FALLBACK)
    assert err.value.param == field and field in str(err.value) and err.value.kind == "invalid"


def test_vocabulary_bounds_token_ids_when_known():
    for field, value in (("stop_token_ids", [100]), ("logit_bias", {100: 1.0})):
        assert getattr(from_request({field: value}, MODEL, FALLBACK), field) == value
        with pytest.raises(SamplingError, match="vocabulary") as err:
            from_request({field: value}, MODEL, FALLBACK, vocab_size=100)
        assert err.value.param == field


def test_an_unknown_field_is_refused_and_a_bad_model_default_too():
    with pytest.raises(SamplingError, match="not a sampling field"):
        from_request({"temprature": 0.5}, MODEL, FALLBACK)
    with pytest.raises(SamplingError) as err:
        from_request({}, GenerationDefaults(top_p=0.0), FALLBACK)
    assert err.value.param == "top_p"


def test_with_fields_keeps_the_base_and_checks_the_result():
    base = from_request({"seed": 4}, MODEL, FALLBACK)
    row = with_fields(base, {"temperature": 0.0, "stop": None})
    assert (row.temperature, row.seed, row.top_k, row.stop) == (0.0, 4, 20, [])
    with pytest.raises(SamplingError):
        with_fields(base, {"max_tokens": -3})


def test_the_engine_check_is_the_same_check():
    check_params(SamplingParams())
    with pytest.raises(SamplingError) as err:
        check_params(SamplingParams(temperature=3.0))
    assert err.value.param == "temperature"
