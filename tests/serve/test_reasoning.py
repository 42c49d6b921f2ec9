"""The reply splits every route makes, without a model: `<think>` reasoning (whole and streamed in any
pieces), template variables, the calculator's steps out of our format's token ids, and a
constraint moved past the reasoning."""

from __future__ import annotations

import pytest

from portachat.engine.structured import StructuredSpec
from portachat.serve.api.calculator_steps import CalculatorStep, ReplySplitter, split_reply, with_steps
from portachat.serve.api.errors import APIError
from portachat.serve.api.reasoning import (
    NO_THINKING,
    StreamingReasoningParser,
    Thinking,
    after_reasoning,
    reasoning_format,
    split_reasoning,
    starts_inside,
    template_variables,
)
from portachat.tokenizer.protocol import ToolTokens

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
