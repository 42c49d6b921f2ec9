"""The reply splits every route makes, without a model: `<think>` reasoning (whole and streamed in any
pieces), template variables (reasoning_effort rendered by a template, from chat completions and
Responses), the calculator's steps out of our format's token ids, and a constraint moved past the
reasoning (a forced tool call on a thinking model: its grammar over real tokens, then the route's split).
Prompts go through the server's own renderer (prompt.chat_prompt)."""

from __future__ import annotations

import json

import pytest
from api_testing import prompt_lease

from portachat.engine.structured import StructuredSpec
from portachat.engine.structured.compile import Constraints
from portachat.serve.api.calculator_steps import CalculatorStep, ReplySplitter, split_reply, with_steps
from portachat.serve.api.errors import APIError
from portachat.serve.api.prompt import chat_prompt
from portachat.serve.api.protocol import ChatCompletionRequest
from portachat.serve.api.reasoning import (
    NO_THINKING,
    StreamingReasoningParser,
    Thinking,
    after_reasoning,
    reasoning_format,
    split_reasoning,
    starts_inside,
    template_variables,
    thinking_of,
)
from portachat.serve.api.response_items import chat_messages, normalised_input
from portachat.serve.api.responses import ResponsesRequest, as_chat_request
from portachat.serve.api.tool_calls import call_format, parse_tool_calls, tool_call_spec, tool_request
from portachat.tokenizer.chat_tokenizer import TemplateChatTokenizer
from portachat.tokenizer.protocol import ToolTokens
from tests.model.hf_families import train_bpe
from tests.serve.tool_templates import HERMES_TOOLS, WEATHER_TOOL

REPLY = "<think>\nadd them\n\n</think>\n\nThe answer is 81."


def test_a_think_block_is_split_off_and_its_newlines_belong_to_neither_part():
    assert split_reasoning(REPLY, "think") == ("add them", "The answer is 81.")
    assert split_reasoning("no block here", "think") == (None, "no block here")
    assert split_reasoning(REPLY, None) == (None, REPLY)  # a model whose template does not think
    # DeepSeek-R1's prompt opens the block itself: the reply starts inside it.
    assert split_reasoning("add them</think>81", "think", inside=True) == ("add them", "81")
    assert split_reasoning("<think>cut off by max_tokens", "think") == ("cut off by max_tokens", "")


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8])
def test_streamed_pieces_reassemble_into_the_whole_split(size):
    parser = StreamingReasoningParser("think")
    reasoning, answer = "", ""
    for start in range(0, len(REPLY), size):
        r, a = parser.feed(REPLY[start : start + size])
        reasoning, answer = reasoning + r, answer + a
    r, a = parser.finish()
    assert (reasoning + r, answer + a) == split_reasoning(REPLY, "think")


def test_the_format_and_an_open_block_are_read_from_the_template_and_prompt():
    assert reasoning_format("{{ '<think>' }}…{{ '</think>' }}") == "think"
    assert reasoning_format("<|im_start|>{{ m.content }}") is None and reasoning_format(None) is None
    assert starts_inside("<|im_start|>assistant\n<think>\n") and not starts_inside("assistant\n<think>\n\n</think>\n\n")


def test_template_variables_take_the_request_fields_and_refuse_the_servers_own():
    assert template_variables({"enable_thinking": False}, "low") == {"enable_thinking": False,
                                                                     "reasoning_effort": "low"}
    assert template_variables(None, enable_thinking=True) == {"enable_thinking": True}
    with pytest.raises(APIError) as refused:
        template_variables({"messages": []})
    assert refused.value.status == 400 and refused.value.param == "chat_template_kwargs"


class _Ours:
    """Our chat format's shape: four tool control ids (text-less), every other id one character."""

    tool_tokens = ToolTokens(python_start=1, python_end=2, output_start=3, output_end=4)
    chars = "_+=0123456789答案：。"

    def encode(self, text: str) -> list[int]:
        return [10 + self.chars.index(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.chars[i - 10] for i in ids if i >= 10)

    def token_bytes(self, token_id: int) -> bytes:
        return self.decode([token_id]).encode()


def test_calculator_steps_leave_the_answer_clean():
    tok, t = _Ours(), _Ours.tool_tokens
    ids = [t.python_start, *tok.encode("23+58"), t.python_end, t.output_start, *tok.encode("81"), t.output_end,
           *tok.encode("答案：81。")]
    text = tok.decode(ids)  # what the engine's text is: the step runs into the answer
    assert text == "23+5881答案：81。"
    assert split_reply(tok, NO_THINKING, [(text, ids)]) == (None, "答案：81。", [CalculatorStep("23+58", "81")])
    # One token per output, as a stream sends them: the same split.
    splitter, answer, steps = ReplySplitter(tok, NO_THINKING), "", []
    for i, token in enumerate(ids):
        piece = splitter.feed(tok.decode([token]), [token], last=i == len(ids) - 1)
        answer, steps = answer + piece.answer, steps + piece.steps
    assert (answer, steps) == ("答案：81。", [CalculatorStep("23+58", "81")])
    # An expression the calculator refuses gets no result; the model carries on.
    refused = [t.python_start, *tok.encode("2+"), t.python_end, *tok.encode("3")]
    assert split_reply(tok, NO_THINKING, [(tok.decode(refused), refused)]) == (None, "3",
                                                                                [CalculatorStep("2+", None)])
    assert with_steps(None, [CalculatorStep("23+58", "81")]) == "23+58 = 81"
    assert with_steps("thinking", [CalculatorStep("1+1", "2"), CalculatorStep("2+", None)]) == "thinking\n1+1 = 2\n2+"


def test_a_constraint_moves_past_the_reasoning_of_a_thinking_model_only():
    spec = StructuredSpec("json", {"type": "object"}, param="response_format.json_schema.schema")
    assert after_reasoning(spec, NO_THINKING) is spec
    wrapped = after_reasoning(spec, Thinking("think"))
    assert wrapped.kind == "grammar" and wrapped.param == spec.param
    assert 'start: think? answer' in wrapped.value and '%json' in wrapped.value
    assert "start: think answer" in after_reasoning(spec, Thinking("think", inside=True)).value
    own = StructuredSpec("grammar", "start: /[a-z]+/", param="structured_outputs.grammar")
    assert after_reasoning(own, Thinking("think")) is own  # a client's own grammar keeps its start rule


# A Qwen3-style template: Hermes tool calls, and earlier reasoning shown in a <think> block.
THINKING_HERMES = HERMES_TOOLS.replace(
    "{%- if message.content %}\n{{ message.content }}{%- endif %}",
    "{%- if message.reasoning_content %}\n<think>\n{{ message.reasoning_content }}\n</think>\n{%- endif %}"
    "{%- if message.content %}\n{{ message.content }}{%- endif %}", 1)
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
FREE_REASONING = 'Paris, so {"city": "Paris"}; no <tool_call> yet'  # JSON and tags: free text in the block



def template_tokenizer(template: str) -> TemplateChatTokenizer:
    return TemplateChatTokenizer(train_bpe(), {"chat_template": template, "eos_token": "<|im_end|>"})


def accepts(matcher, ids: list[int]) -> bool:
    return all(matcher.consume_token(t) for t in ids)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_tool_call_on_a_thinking_model_leaves_the_reasoning_free_and_is_parsed_from_the_answer(choice):
    tok = template_tokenizer(THINKING_HERMES)
    chat = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "Weather in Paris?"}],
                                                 "tools": [WEATHER_TOOL], "tool_choice": choice})
    tools = tool_request(chat.tools, chat.tool_choice, chat.parallel_tool_calls)
    fmt = call_format(tok.chat_template)
    prompt_ids = chat_prompt(prompt_lease(tok), chat, tools)
    thinking = thinking_of(tok, prompt_ids)
    assert (fmt, thinking) == ("hermes", Thinking("think"))
    enforced = tool_call_spec(tools, fmt)
    spec = after_reasoning(enforced, thinking)  # what the route hands the engine
    assert spec.param == "tool_choice"

    constraints = Constraints(tok, tok.vocab_size)
    reply = tok.encode(f"<think>\n{FREE_REASONING}\n</think>\n\n{CALL}")
    matcher = constraints.matcher(spec)
    assert accepts(matcher, reply), matcher.get_error()
    assert matcher.consume_token(tok.end_ids[0]) and matcher.is_stopped()  # the call done, the turn may end
    assert not accepts(constraints.matcher(enforced), reply)  # without the move, the block itself is refused
    # After the block the answer must be the call: prose is refused there.
    assert not accepts(constraints.matcher(spec), tok.encode(f"<think>\n{FREE_REASONING}\n</think>\n\nIt is sunny"))

    # The route's split: reasoning first, then the call parsed from the answer alone.
    reasoning, answer, steps = split_reply(tok, thinking, [(tok.decode(reply), reply)])
    text, calls = parse_tool_calls(answer, fmt)
    assert (reasoning, text, steps) == (FREE_REASONING, "", [])
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]


EFFORT_TEMPLATE = (
    "{% if reasoning_effort is defined %}<|im_start|>system\nReasoning: {{ reasoning_effort }}<|im_end|>\n{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_reasoning_effort_reaches_the_template_from_chat_completions_and_responses():
    tok = template_tokenizer(EFFORT_TEMPLATE)
    question = [{"role": "user", "content": "hi"}]

    def chat_text(**fields) -> str:
        chat = ChatCompletionRequest.model_validate({"messages": question, **fields})
        return tok.decode(chat_prompt(prompt_lease(tok), chat))

    def responses_text(**fields) -> str:
        req = ResponsesRequest.model_validate({"input": "hi", **fields})
        chat = as_chat_request(req, chat_messages(normalised_input(req.input), None))
        return tok.decode(chat_prompt(prompt_lease(tok), chat))

    plain = chat_text()
    assert "Reasoning" not in plain and responses_text() == plain
    for effort in ("low", "high"):
        shown = f"system\nReasoning: {effort}"
        assert shown in chat_text(reasoning_effort=effort) and chat_text(reasoning_effort=effort).endswith(plain)
        assert responses_text(reasoning={"effort": effort}) == chat_text(reasoning_effort=effort)
    # chat_template_kwargs names it too; the request's own field does not override it.
    assert "Reasoning: low" in chat_text(reasoning_effort="high", chat_template_kwargs={"reasoning_effort": "low"})
