"""Teacher-forced log-probabilities through the engine's paged KV cache (perplexity, cache checks), and a
prompt's top-k log-probabilities at every position (the server's prompt_logprobs).

Each given text is fed one token per step as a decode step, all texts batched together, so every
attention read goes through the engine's own cache in its own storage dtype (an int8 or fp8 cache
included: each token's key and value are quantized on write, before any query reads them) and
through the same decode path that serving uses (packed CPU kernels, padded graph steps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from portachat.engine.detokenizer import Detokenizer
from portachat.engine.engine import LLMEngine
from portachat.engine.scheduler import ScheduledSeq
from portachat.engine.sequence import Sequence
from portachat.engine.types import EngineError, SamplingParams
from portachat.i18n import _


@torch.inference_mode()
def teacher_forced_logprobs(engine: LLMEngine, texts: list[list[int]], adapter: str | None = None,
                            ) -> list[list[float]]:
    """For each token list, log p(token i | tokens < i) for i >= 1 (under LoRA adapter `adapter` if
    given). Call between engine steps (it borrows free KV blocks and the runner, and gives them back)."""
    if not texts or any(len(t) < 2 for t in texts):
        raise ValueError(_("give at least one token list, each of at least two tokens"))
    longest = max(len(t) for t in texts)
    if longest > engine.max_model_len:
        raise ValueError(_("a token list of {tokens} tokens is longer than the context ({context})").format(
            tokens=longest, context=engine.max_model_len))
    blocks = engine.blocks
    seqs = [Sequence(request_id=f"score-{i}", prompt_ids=t[:1], params=SamplingParams(max_tokens=1, adapter=adapter),
                     detokenizer=Detokenizer(engine.tokenizer.token_bytes, []), generator=None, arrival=-1)
            for i, t in enumerate(texts)]  # fmt: skip
    need = sum(blocks.blocks_needed(s, len(t)) for s, t in zip(seqs, texts, strict=True))
    if need > blocks.num_free:
        raise EngineError(_("scoring needs {need} free KV blocks, {free} are free").format(
            need=need, free=blocks.num_free), kind="invalid")
    out: list[list[float]] = [[] for _ in texts]
    try:
        for s, t in zip(seqs, texts, strict=True):
            blocks.allocate(s, len(t))
        for pos in range(longest - 1):
            live = [i for i, t in enumerate(texts) if pos + 1 < len(t)]
            # The sequence ends at `pos`, so its row samples: logits for the token after it.
            batch = [ScheduledSeq(seqs[i], pos, 1) for i in live]
            logits = engine.runner.forward(engine.runner.prepare(batch))
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            targets = torch.tensor([texts[i][pos + 1] for i in live], device=logprobs.device)
            picked = logprobs.gather(1, targets[:, None])[:, 0].tolist()
            for i, lp in zip(live, picked, strict=True):
                out[i].append(lp)
                seqs[i].token_ids.append(texts[i][pos + 1])
    finally:
        for s in seqs:
            blocks.free_sequence(s)
    return out


def perplexity(logprobs: list[list[float]]) -> float:
    """exp of the mean negative log-probability over every scored token."""
    flat = [lp for row in logprobs for lp in row]
    return math.exp(-sum(flat) / len(flat))


@dataclass
class PromptScores:
    """Per prompt position i >= 1: the k most likely tokens after prompt[:i] (ids, log-probabilities,
    most likely first), and the prompt's own token there with its log-probability and rank (1 = most likely)."""

    top_ids: list[list[int]]
    top_logprobs: list[list[float]]
    token_logprobs: list[float]
    token_ranks: list[int]


@torch.inference_mode()
def prompt_top_logprobs(engine: LLMEngine, prompt: list[int], k: int, adapter: str | None = None) -> PromptScores:
    """vLLM's prompt_logprobs at temperature 1, from one forward over the whole prompt through the engine's
    own step (packed kernels, LoRA, tensor-parallel shards alike): the prompt runs as its first token plus a
    "draft" of the rest, the rows speculative verification uses, so every position gets its logits at once.
    Call between engine steps (it borrows free KV blocks and gives them back)."""
    if len(prompt) > engine.max_model_len:
        raise EngineError(_("a prompt of {n} tokens is longer than the context ({limit}): send a shorter prompt or "
                            "raise --max-model-len").format(
            n=len(prompt), limit=engine.max_model_len), kind="too_long")
    if len(prompt) < 2:
        return PromptScores([], [], [], [])
    blocks = engine.blocks
    seq = Sequence(request_id="prompt-logprobs", prompt_ids=prompt[:1],
                   params=SamplingParams(max_tokens=1, adapter=adapter),
                   detokenizer=Detokenizer(engine.tokenizer.token_bytes, []), generator=None, arrival=-1)
    need = blocks.blocks_needed(seq, len(prompt))
    if need > blocks.num_free:
        raise EngineError(_("scoring needs {need} free KV blocks, {free} are free").format(
            need=need, free=blocks.num_free), kind="queue_full")
    try:
        blocks.allocate(seq, len(prompt))
        rows = engine.runner.forward(engine.runner.prepare([ScheduledSeq(seq, 0, 1, draft=list(prompt[1:]))]))
    finally:
        blocks.free_sequence(seq)
    logprobs = torch.log_softmax(rows[:-1].float(), dim=-1)  # the last row is the token after the prompt
    actual = torch.tensor(prompt[1:], device=logprobs.device)[:, None]
    own = logprobs.gather(1, actual)
    ranks = (logprobs > own).sum(dim=1) + 1
    values, ids = logprobs.topk(min(k, logprobs.size(-1)), dim=-1)
    return PromptScores(ids.tolist(), values.tolist(), own[:, 0].tolist(), ranks.tolist())
