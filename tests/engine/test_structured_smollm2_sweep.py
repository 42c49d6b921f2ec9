"""Issue 15's schema sweep with the real SmolLM2-135M-Instruct (GGUF tokenizer rebuilt as byte-level
BPE): 20 JSON schemas of varied shape — nested objects, arrays, enums, bounded numbers, optional
fields, Chinese string values — each answered greedily and with 5 sampling seeds, all in one batch;
every reply parses and validates (jsonschema). json_object always parses; a regex and a choice list
always match. Strings, arrays and numbers are bounded (integers: a float's digits have no bound a
schema can state) so that a reply always fits its token budget."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from portachat.engine import SamplingParams
from portachat.engine.oneshot import engine_for
from portachat.engine.structured import StructuredSpec
from portachat.model.load import load_for_inference
from tests.smollm2 import smollm2_gguf_path

pytestmark = pytest.mark.slow


def obj(props: dict, required: list[str] | None = None) -> dict:
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": False}


S = {"type": "string", "maxLength": 10}
SCHEMAS = [
    obj({"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 120}}),
    obj({"city": {"enum": ["北京", "上海", "广州", "深圳"]}, "population_millions": {"type": "integer", "minimum": 0,
                                                                           "maximum": 40}}),
    obj({"title": S, "tags": {"type": "array", "items": S, "minItems": 1, "maxItems": 3}}),
    obj({"ok": {"type": "boolean"}, "note": S}, required=["ok"]),
    obj({"user": obj({"id": {"type": "integer", "minimum": 1, "maximum": 9999}, "nick": S}),
         "active": {"type": "boolean"}}),
    obj({"colour": {"enum": ["red", "green", "blue"]}, "shade": {"type": "integer", "minimum": 0, "maximum": 255}}),
    obj({"points": {"type": "array", "items": obj({"x": {"type": "integer", "minimum": -9, "maximum": 9},
                                                   "y": {"type": "integer", "minimum": -9, "maximum": 9}}),
                    "minItems": 1, "maxItems": 3}}),
    obj({"answer": {"type": "integer", "minimum": 0, "maximum": 200}, "unit": {"enum": ["个", "只", "本"]}}),
    obj({"question": {"type": "string", "maxLength": 12}, "choices": {"type": "array", "items": S, "minItems": 2,
                                                                      "maxItems": 4}}),
    obj({"temperature": {"type": "integer", "minimum": -30, "maximum": 50}, "sunny": {"type": "boolean"}}),
    obj({"book": obj({"title": S, "year": {"type": "integer", "minimum": 1800, "maximum": 2030}}),
         "rating": {"enum": [1, 2, 3, 4, 5]}}),
    obj({"word": S, "letters": {"type": "integer", "minimum": 1, "maximum": 20}, "vowels": {"type": "integer",
                                                                                              "minimum": 0,
                                                                                              "maximum": 20}}),
    obj({"姓名": {"type": "string", "maxLength": 6}, "年龄": {"type": "integer", "minimum": 0, "maximum": 120}}),
    obj({"items": {"type": "array", "items": {"enum": ["apple", "pear", "plum"]}, "maxItems": 3}}),
    obj({"a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "integer", "minimum": 0, "maximum": 99},
         "sum": {"type": "integer", "minimum": 0, "maximum": 198}}),
    obj({"status": {"enum": ["open", "closed"]}, "owner": {"anyOf": [S, {"type": "null"}]}}),
    obj({"lat": {"type": "integer", "minimum": -90, "maximum": 90}, "lon": {"type": "integer", "minimum": -180,
                                                                            "maximum": 180}}),
    obj({"reply": {"type": "string", "maxLength": 16}, "language": {"enum": ["zh", "en"]}}, required=["reply"]),
    obj({"matrix": {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0,
                                                                          "maximum": 9},
                                               "minItems": 2, "maxItems": 2}, "minItems": 2, "maxItems": 2}}),
    obj({"event": S, "day": {"enum": ["周一", "周二", "周三", "周四", "周五"]}, "hour": {"type": "integer", "minimum": 0,
                                                                                "maximum": 23}}),
]
PROMPTS = ["Describe a person.", "介绍一个中国城市。", "Write a short note with tags.", "Is it done?", "Make a user.",
           "Pick a colour.", "Give some points.", "数一数有几个苹果。", "Ask a quiz question.", "What is the weather?",
           "Recommend a book.", "Analyse a word.", "介绍一个人。", "List some fruit.", "Add two numbers.",
           "Report a ticket.", "Where is Paris?", "用中文或英文回答一句话。", "Make a small matrix.", "安排一个活动。"]
SEEDS = [0, 1, 2, 3, 4]


@pytest.fixture(scope="module")
def smol():
    loaded = load_for_inference(smollm2_gguf_path(), device="cpu", dtype=torch.bfloat16)
    return loaded.model.requires_grad_(False), loaded.tokenizer


def test_twenty_schemas_greedy_and_five_seeds_all_validate(smol):
    model, tok = smol
    assert len(SCHEMAS) == len(PROMPTS) == 20
    prompts, params, schemas = [], [], []
    for schema, text in zip(SCHEMAS, PROMPTS, strict=True):
        ids = tok.render_prompt([{"role": "user", "content": text + " Answer in JSON."}])
        for seed in [None, *SEEDS]:  # greedy, then sampled
            prompts.append(ids)
            params.append(SamplingParams(max_tokens=160, temperature=0.0 if seed is None else 0.8, seed=seed,
                                         structured=StructuredSpec("json", schema)))
            schemas.append(schema)
    engine = engine_for(model, tok, max_num_seqs=40, max_model_len=512)
    outs = engine.generate(prompts, params)
    for out, schema, p in zip(outs, schemas, params, strict=True):
        assert out.finish_reason == "stop", (out.text, schema)
        jsonschema.validate(json.loads(out.text), schema)  # raises with the path that fails
        assert p.temperature == 0.0 or p.seed is not None


def test_json_object_regex_and_choice_always_hold(smol):
    model, tok = smol
    ids = tok.render_prompt([{"role": "user", "content": "Give me your phone number and a JSON object."}])
    params = []
    for seed in SEEDS:
        params += [
            SamplingParams(max_tokens=120, temperature=0.8, seed=seed, structured=StructuredSpec("json_object", None)),
            SamplingParams(max_tokens=40, temperature=0.8, seed=seed,
                           structured=StructuredSpec("regex", r"\+86 1[3-9][0-9]{9}")),
            SamplingParams(max_tokens=20, temperature=0.8, seed=seed,
                           structured=StructuredSpec("choice", ["是", "否", "不确定"])),
        ]
    engine = engine_for(model, tok, max_num_seqs=16, max_model_len=512)
    outs = engine.generate([ids] * len(params), params)
    for i in range(0, len(outs), 3):
        obj_out, regex_out, choice_out = outs[i : i + 3]
        if obj_out.finish_reason == "stop":  # an open object may run out of tokens; a finished one parses
            assert isinstance(json.loads(obj_out.text), dict)
        else:
            assert obj_out.text.startswith("{")
        assert re.fullmatch(r"\+86 1[3-9][0-9]{9}", regex_out.text)
        assert choice_out.text in ("是", "否", "不确定")
