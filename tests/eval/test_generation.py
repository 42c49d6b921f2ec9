from __future__ import annotations

import torch

from portachat.eval.generation import as_chat_tokenizer, model_complete, next_token_logits, reply_text


def test_model_complete_runs_the_calculator(tool_model, small_tokenizer):
    model, convs = tool_model
    tok = as_chat_tokenizer(small_tokenizer)
    complete = model_complete(model, tok)
    replies = complete([c[:1] for c in convs], 40, 0.0)
    for conv, reply in zip(convs, replies, strict=True):
        expr = conv[1]["content"][0]["text"]
        result = str(eval(expr, {"__builtins__": {}}))  # "23+58": digits and one +
        # the output was never a training target: only the tool loop can have put it there
        assert f"<|python_start|>{expr}<|python_end|><|output_start|>{result}<|output_end|>" in reply
        assert reply.endswith(f"The answer is {result}.")
    # without room for the tool output, the reply stops short rather than overrunning max_tokens
    short = complete([convs[0][:1]], 5, 0.0)[0]
    assert len(tok.encode(short.replace("<|python_start|>", "").replace("<|python_end|>", ""))) <= 5


def test_reply_text_keeps_tool_markers_and_drops_stops(small_tokenizer):
    tok = as_chat_tokenizer(small_tokenizer)
    t = tok.tool_tokens
    ids = [t.python_start, *tok.encode("1+2"), t.python_end, t.output_start, *tok.encode("3"), t.output_end,
           *tok.encode("The answer is 3."), next(iter(tok.stop_ids)), *tok.encode("junk")]
    assert reply_text(tok, ids) == "<|python_start|>1+2<|python_end|><|output_start|>3<|output_end|>The answer is 3."


def test_batched_next_token_logits_match_one_at_a_time(tool_model):
    model, _ = tool_model
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist() for n in (3, 11, 7, 1, 9)]
    batched = next_token_logits(model, prompts, batch_size=4)
    with torch.no_grad():
        single = torch.stack([model(torch.tensor([p]))[0, -1] for p in prompts])
    assert batched.shape == (5, model.config.vocab_size)
    torch.testing.assert_close(batched, single, atol=1e-4, rtol=1e-4)


def cacheless_greedy_reply(model, tok, conversation, max_tokens: int) -> str:
    """Reference with no KV cache at all: one full forward per token, the calculator run by hand."""
    from portachat.engine.calculator import calculate

    t = tok.tool_tokens
    ids, out = tok.render_prompt(conversation), []
    while len(out) < max_tokens:
        with torch.inference_mode():
            token = int(model(torch.tensor([ids + out]))[0, -1].argmax())
        out.append(token)
        if token in tok.stop_ids:
            break
        if token == t.python_end and t.python_start in out:
            start = len(out) - 1 - out[::-1].index(t.python_start)
            result = calculate(tok.decode(out[start + 1 : -1]))
            if result is not None:
                out += [t.output_start, *tok.encode(result), t.output_end][: max_tokens - len(out)]
    return reply_text(tok, out)


def test_model_complete_greedy_replies_equal_full_forwards(tool_model, small_tokenizer):
    model, convs = tool_model
    tok = as_chat_tokenizer(small_tokenizer)
    prompts = [c[:1] for c in convs] + [[{"role": "user", "content": "What is 5+6?"}]]
    replies = model_complete(model, tok)(prompts, 40, 0.0)
    assert replies == [cacheless_greedy_reply(model, tok, p, 40) for p in prompts]
    assert all("<|output_start|>" in r for r in replies[:3])  # the comparison covers the tool loop
