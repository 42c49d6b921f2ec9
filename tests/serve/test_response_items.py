"""A built-in calculator step round-trips through the Responses API: the `code_interpreter_call` item the
server outputs, sent back as input (the OpenAI Agents SDK resends every earlier item each turn) or kept
in a stored response's history (`previous_response_id`), renders into the next prompt as the tool
tokens and result the model's own turn had. Rendered through the server's own prompt function
(prompt.chat_prompt) with our tokenizer; no model."""

from __future__ import annotations

import json

import pytest
from api_testing import prompt_lease

from portachat.serve.api.calculator_steps import CalculatorStep, split_reply
from portachat.serve.api.errors import APIError
from portachat.serve.api.prompt import chat_prompt
from portachat.serve.api.reasoning import NO_THINKING
from portachat.serve.api.response_items import chat_messages, normalised_input, output_items
from portachat.serve.api.responses import ResponsesRequest, as_chat_request
from portachat.tokenizer.bpe import ASSISTANT_END
from portachat.tokenizer.chat_tokenizer import PortachatChatTokenizer, TemplateChatTokenizer
from tests.model.hf_families import CHATML, train_bpe

QUESTION, ANSWER, NEXT = "23加58等于多少？", "答案：81。", "and 9*9?"


@pytest.fixture(scope="module")
def tok(small_tokenizer) -> PortachatChatTokenizer:
    return PortachatChatTokenizer(small_tokenizer)


def model_turn(tok: PortachatChatTokenizer) -> list[int]:
    """The reply a speedrun model writes (the engine forcing the calculator's `81`), ending its turn."""
    t = tok.tool_tokens
    return [t.python_start, *tok.encode("23+58"), t.python_end, t.output_start, *tok.encode("81"), t.output_end,
            *tok.encode(ANSWER), tok.tokenizer.special_ids[ASSISTANT_END]]


def server_output(tok: PortachatChatTokenizer) -> list[dict]:
    """The Responses output the server made of that reply, as a client receives it (JSON)."""
    reply = model_turn(tok)[:-1]
    reasoning, answer, steps = split_reply(tok, NO_THINKING, [(tok.decode(reply), reply)])
    assert steps == [CalculatorStep("23+58", "81")]
    return json.loads(json.dumps(output_items(reasoning, answer, [], steps)))



def rendered(tokenizer, request: dict, history: list[dict] | None = None) -> list[int]:
    """Prompt ids of a Responses request, the way POST /v1/responses renders them."""
    req = ResponsesRequest.model_validate(request)
    items = normalised_input(req.input)
    return chat_prompt(prompt_lease(tokenizer), as_chat_request(req, chat_messages((history or []) + items, None)))


def expected_prompt(tok: PortachatChatTokenizer) -> list[int]:
    """The question, the model's own turn token for token, then the next question."""
    special = tok.tokenizer.special_ids
    return [*tok.render_prompt([{"role": "user", "content": QUESTION}]), *model_turn(tok),
            special["<|user_start|>"], *tok.encode(NEXT), special["<|user_end|>"], special["<|assistant_start|>"]]


def test_an_output_with_a_calculator_step_sent_back_as_input_renders_the_models_own_turn(tok):
    output = server_output(tok)
    assert [item["type"] for item in output] == ["code_interpreter_call", "message"]
    items = [{"role": "user", "content": QUESTION}, *output, {"role": "user", "content": NEXT}]
    assert rendered(tok, {"input": items}) == expected_prompt(tok)
    # The step is one assistant turn with the answer, in our chat format's parts.
    assert chat_messages(normalised_input(items), None)[1] == {"role": "assistant", "content": [
        {"type": "python", "text": "23+58"}, {"type": "python_output", "text": "81"}, {"type": "text", "text": ANSWER}]}


def test_a_stored_responses_calculator_step_stays_in_the_history(tok):
    # What complete() stores as history: the request's items, then the response's output.
    history = normalised_input([{"role": "user", "content": QUESTION}]) + server_output(tok)
    assert rendered(tok, {"input": NEXT, "previous_response_id": "resp_x"}, history) == expected_prompt(tok)


def test_a_step_without_a_result_renders_the_call_alone(tok):
    refused = output_items(None, "3", [], [CalculatorStep("2+", None)])
    assert refused[0]["outputs"] == []
    assert chat_messages(normalised_input(json.loads(json.dumps(refused))), None) == [{"role": "assistant", "content": [
        {"type": "python", "text": "2+"}, {"type": "text", "text": "3"}]}]


@pytest.mark.parametrize(("item", "param"), [
    ({"code": 5, "outputs": []}, "input[0].code"),
    ({"outputs": []}, "input[0].code"),
    ({"code": "1+1", "outputs": "2"}, "input[0].outputs"),
    ({"code": "1+1", "outputs": [{"type": "image", "url": "https://x"}]}, "input[0].outputs[0]"),
    ({"code": "1+1", "outputs": [{"type": "logs", "logs": 2}]}, "input[0].outputs[0]"),
])
def test_a_malformed_calculator_item_is_refused_naming_the_field(item, param):
    with pytest.raises(APIError) as refused:
        normalised_input([{"type": "code_interpreter_call", "id": "ci_1", **item}])
    assert refused.value.status == 400 and refused.value.param == param


def test_a_model_without_the_calculator_refuses_a_step():
    chatml = TemplateChatTokenizer(train_bpe(), {"chat_template": CHATML, "eos_token": "<|im_end|>"})
    items = [{"role": "user", "content": "hi"}, {"type": "code_interpreter_call", "code": "1+1",
                                                 "outputs": [{"type": "logs", "logs": "2"}]}, {"role": "user", "content": "ok"}]
    with pytest.raises(APIError) as refused:
        rendered(chatml, {"input": items})
    assert refused.value.status == 400 and refused.value.param == "messages[1].content"
