from __future__ import annotations

import torch

from portachat.eval.generation import as_chat_tokenizer, model_complete, next_token_logits, reply_text


def test_plain_generator_runs_the_calculator(tool_model, small_tokenizer):
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


def test_engine_and_plain_generator_give_the_same_greedy_replies(tool_model, small_tokenizer):
    import copy

    from portachat.device import get_device
    from portachat.eval.generation import engine_complete
    from portachat.serve.engine.config import EngineConfig
    from portachat.serve.engine.engine import LLMEngine

    model, convs = tool_model
    tok = as_chat_tokenizer(small_tokenizer)
    prompts = [c[:1] for c in convs] + [[{"role": "user", "content": "What is 5+6?"}]]
    plain = model_complete(model, tok)(prompts, 40, 0.0)
    engine = LLMEngine(copy.deepcopy(model), tok, EngineConfig(num_blocks=64, dtype="fp32", compile=False),
                       device=get_device("cpu"))
    assert engine_complete(engine, tok)(prompts, 40, 0.0) == plain
