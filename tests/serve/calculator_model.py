"""A tiny model of ours (our chat format, our tokenizer) that uses the built-in calculator the way the
speedrun's models do: to "23加58等于多少？" it writes `<|python_start|>23+58<|python_end|>`, the engine
computes and forces `<|output_start|>81<|output_end|>`, then the model writes `答案：81。`. Trained in a
few seconds; shared by the tests of every place that shows the step (the APIs, the page, `chat`)."""

from __future__ import annotations

from api_testing import chat_tokenizer
from thinking_model import train_replies

from portachat.model import GPT
from portachat.tokenizer import Tokenizer
from portachat.tokenizer.chat_tokenizer import PortachatChatTokenizer

QUESTION = "23加58等于多少？"
ANSWER = "答案：81。"
STEP = "23+58 = 81"


def calculator_reply(tokenizer: Tokenizer) -> list[int]:
    """The reply's ids: the call, the result the engine forces, the answer, the end token."""
    tok = chat_tokenizer(tokenizer)
    tools = tok.tool_tokens
    return [tools.python_start, *tok.encode("23+58"), tools.python_end, tools.output_start, *tok.encode("81"),
            tools.output_end, *tok.encode(ANSWER), tokenizer.end_ids[0]]


def train_calculator_model(tokenizer: Tokenizer) -> tuple[PortachatChatTokenizer, GPT]:
    """Our chat tokenizer over `tokenizer` (the `small_tokenizer` fixture), and a depth-2, width-64 GPT
    fit until greedy decoding writes `calculator_reply` to QUESTION."""
    tok = chat_tokenizer(tokenizer)
    rows = [(tok.render_prompt([{"role": "user", "content": QUESTION}]), calculator_reply(tokenizer))] * 4
    return tok, train_replies(tok.vocab_size, rows, steps=60)
