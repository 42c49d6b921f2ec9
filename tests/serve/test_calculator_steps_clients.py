"""The built-in calculator's work shown as tool use, apart from the answer, in every API: a tiny model
of ours (our chat format, our tokenizer), trained in the test to answer "23加58等于多少？" the way the
speedrun's models do, with `<|python_start|>23+58<|python_end|>`, then (after the result the engine
itself computes and forces) `答案：81。`. Before, the reply's text was `23+5881答案：81。`."""

from __future__ import annotations

import anthropic
import openai
import pytest
from api_testing import served_tiny, start_server
from calculator_model import ANSWER, QUESTION, train_calculator_model

from tests.serve.test_web import browser  # noqa: F401 - the headless Chromium fixture

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(small_tokenizer):
    tok, model = train_calculator_model(small_tokenizer)
    running = start_server(served_tiny(tok, model=model))
    yield running
    running.stop()


def test_the_calculator_step_is_shown_apart_from_the_answer_in_every_api(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": QUESTION}]
    message = client.chat.completions.create(model="tiny", messages=messages, temperature=0,
                                             max_tokens=40).choices[0].message
    assert message.content == ANSWER and message.model_extra["reasoning_content"] == "23+58 = 81"
    steps, content = "", ""
    for chunk in client.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=40,
                                                stream=True):
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is not None:
            steps += (delta.model_extra or {}).get("reasoning_content") or ""
            content += delta.content or ""
    assert (steps, content) == ("23+58 = 81", ANSWER)

    claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=120)
    reply = claude.messages.create(model="tiny", messages=messages, max_tokens=40, extra_body={"temperature": 0})
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in reply.content] == [
        ("thinking", "23+58 = 81"), ("text", ANSWER)]

    response = client.responses.create(model="tiny", input=QUESTION, temperature=0, max_output_tokens=40)
    call, answer = response.output
    assert call.type == "code_interpreter_call" and call.code == "23+58" and call.outputs[0].logs == "81"
    assert answer.type == "message" and response.output_text == ANSWER
    with client.responses.stream(model="tiny", input=QUESTION, temperature=0, max_output_tokens=40) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert [i.type for i in final.output] == ["code_interpreter_call", "message"] and final.output_text == ANSWER

    # An Agents SDK agent resends the step (as the code_interpreter_call item it got) on its next turn.
    from agents import Agent, ModelSettings, Runner, set_tracing_disabled
    from agents.models.openai_responses import OpenAIResponsesModel

    set_tracing_disabled(True)
    agent = Agent(name="calculator", model=OpenAIResponsesModel(model="tiny", openai_client=openai.AsyncOpenAI(
        base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120)),
                  model_settings=ModelSettings(temperature=0, max_tokens=40))
    first = Runner.run_sync(agent, QUESTION)
    assert first.final_output == ANSWER
    resent = first.to_input_list()
    assert [item.get("type") for item in resent][1] == "code_interpreter_call"
    second = Runner.run_sync(agent, [*resent, {"role": "user", "content": QUESTION}])  # a 400 before
    assert second.raw_responses[0].usage.input_tokens > first.raw_responses[0].usage.input_tokens


def test_the_chat_page_shows_the_step_in_its_own_box(server, browser):  # noqa: F811 - the fixture imported above
    page = browser.new_page()
    try:
        page.goto(server.url + "/")
        page.wait_for_function("document.querySelector('[data-testid=model]').textContent === 'tiny'")
        page.click("[data-testid=toggle-settings]")
        page.fill("[data-testid=temperature]", "0")
        page.fill("[data-testid=max-tokens]", "40")  # the tiny model's context is 256 tokens
        page.fill("[data-testid=input]", QUESTION)
        page.keyboard.press("Enter")
        done = "[data-testid=message][data-role=assistant][data-status=done]"
        page.wait_for_selector(done, timeout=60_000)
        assert page.inner_text(f"{done} [data-testid=content]").strip() == ANSWER
        assert page.text_content(f"{done} [data-testid=reasoning] pre") == "23+58 = 81"
    finally:
        page.close()
