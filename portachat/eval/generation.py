"""How generative evaluations get answers: a `complete` callable over conversations.

    complete(conversations, max_tokens, temperature) -> replies (one string per conversation)

Evaluators only see this signature. `engine_complete` answers through an `LLMEngine` the caller
built (a loaded model, `portachat eval`); `model_complete` builds one per batch around a model in
memory. Either way the engine runs the calculator tool when the model calls it, and the reply keeps
tool calls visible as literal markers:

    <|python_start|>23+58<|python_end|><|output_start|>81<|output_end|>The answer is 81.

so verifiers can tell the model's own final answer from the tool's output.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch

from portachat.engine.oneshot import MAX_NUM_SEQS, engine_for, eval_mode
from portachat.engine.types import SamplingParams
from portachat.tokenizer.chat_tokenizer import PortachatChatTokenizer
from portachat.tokenizer.protocol import ChatTokenizer

Conversation = list[dict[str, Any]]
CompleteFn = Callable[[list[Conversation], int, float], list[str]]

MARKERS = ("<|python_start|>", "<|python_end|>", "<|output_start|>", "<|output_end|>")


def reply_text(tokenizer: ChatTokenizer, ids: list[int]) -> str:
    """A reply's ids as text: stop tokens dropped, tool-call tokens as literal markers."""
    tools = tokenizer.tool_tokens
    marks = {}
    if tools is not None:
        marks = dict(zip((tools.python_start, tools.python_end, tools.output_start, tools.output_end), MARKERS,
                         strict=True))
    stops = tokenizer.stop_ids
    pieces: list[str] = []
    run: list[int] = []
    for t in ids:
        if t in stops:
            break
        if t in marks:
            pieces.append(tokenizer.decode(run))
            pieces.append(marks[t])
            run = []
        else:
            run.append(t)
    pieces.append(tokenizer.decode(run))
    return "".join(pieces)


def as_chat_tokenizer(tokenizer: Any) -> ChatTokenizer:
    """Our bpe Tokenizer wrapped as a ChatTokenizer; a ChatTokenizer is returned as it is."""
    if isinstance(tokenizer, ChatTokenizer):
        return tokenizer

    return PortachatChatTokenizer(tokenizer)


def engine_complete(engine: Any, tokenizer: ChatTokenizer, seed: int = 0, top_k: int = 0) -> CompleteFn:
    """Complete over an `LLMEngine` (portachat.engine): all prompts queued at once."""

    def complete(conversations: list[Conversation], max_tokens: int, temperature: float) -> list[str]:
        prompts = [tokenizer.render_prompt(c) for c in conversations]
        # A reply gets what room the context leaves; a prompt that fills it gets an empty reply.
        rooms = [min(max_tokens, engine.max_model_len - len(p)) for p in prompts]
        todo = [i for i, room in enumerate(rooms) if room > 0]
        params = [SamplingParams(max_tokens=rooms[i], temperature=temperature, top_k=top_k, seed=seed + i)
                  for i in todo]
        results = engine.generate([prompts[i] for i in todo], params) if todo else []
        replies = [""] * len(prompts)
        for i, r in zip(todo, results, strict=True):
            replies[i] = reply_text(tokenizer, r.token_ids)
        return replies

    return complete


def model_complete(model: torch.nn.Module, tokenizer: ChatTokenizer, seed: int = 0, top_k: int = 0) -> CompleteFn:
    """`engine_complete` over an engine built for each call's batch around `model` as it is (weights,
    device and train/eval mode untouched): for a model in memory, e.g. one still training.

    The context is the model's own: a reply gets min(max_tokens, max_seq_len - prompt) tokens."""

    def complete(conversations: list[Conversation], max_tokens: int, temperature: float) -> list[str]:
        if not conversations:
            return []
        longest = max(len(tokenizer.render_prompt(c)) for c in conversations)
        engine = engine_for(model, tokenizer, max_num_seqs=min(len(conversations), MAX_NUM_SEQS),
                            max_model_len=min(model.config.max_seq_len, longest + max_tokens))
        with eval_mode(model):
            return engine_complete(engine, tokenizer, seed=seed, top_k=top_k)(conversations, max_tokens, temperature)

    return complete


@torch.no_grad()
def next_token_logits(model: torch.nn.Module, prompts: list[list[int]], batch_size: int = 16,
                      autocast: Callable[[], Any] | None = None) -> torch.Tensor:
    """fp32 logits [N, V] of the token after each prompt. Prompts are right-padded into batches: a
    causal model's logits at a position never see the padding after it."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    rows = []
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i:i + batch_size]
        width = max(len(p) for p in chunk)
        idx = torch.zeros(len(chunk), width, dtype=torch.long)
        for r, p in enumerate(chunk):
            idx[r, :len(p)] = torch.tensor(p, dtype=torch.long)
        with autocast() if autocast is not None else nullcontext():
            logits = model(idx.to(device))
        last = torch.tensor([len(p) - 1 for p in chunk], device=logits.device)
        rows.append(logits[torch.arange(len(chunk), device=logits.device), last].float().cpu())
    model.train(was_training)
    return torch.cat(rows) if rows else torch.empty(0)
