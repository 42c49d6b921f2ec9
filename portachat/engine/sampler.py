"""Next-token choice for a batch of sequences, each with its own sampling parameters.

Order (as HF/vLLM): penalties and logit_bias on the raw logits, then the structured-output masks
(constrained rows only), then temperature, top-k, top-p, then a draw.
Greedy rows (temperature 0) take the argmax of the penalised logits. Sampled rows are drawn
together by inverse CDF: one softmax and one cumulative sum over the batch, and one uniform number
per row from that request's own CPU generator, so a seed gives the same tokens whatever else is in
the batch. (A `multinomial` per row costs ~1 ms on a 49k vocabulary on a CPU: at 32 streams that
was as long as the decode step itself.) On accelerators top-k / top-p filter the whole batch at once
(ops/fast_ops.top_k_top_p: no host sync; Ascend's fused kernel where it passed its self-test), so a step
waits for the device once, for the chosen ids. Reported logprobs are the model's own (log_softmax of the
raw logits), and with top_logprobs the k likeliest tokens of that same distribution.
"""

from __future__ import annotations

import torch

from portachat.device.fast_path_choice import filters_whole_batch
from portachat.engine.sequence import Sequence
from portachat.engine.structured.masks import TokenMasks
from portachat.ops import fast_ops


def needs_penalties(seq: Sequence) -> bool:
    """The row's logits change before sampling (penalties or logit_bias): no speculation for it."""
    p = seq.params
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 \
        or bool(p.logit_bias)


def apply_penalties(logits: torch.Tensor, seq: Sequence) -> torch.Tensor:
    """Penalised copy of one row [V]: repetition over prompt + output (HF: divide positive logits,
    multiply negative ones), presence/frequency over the output (OpenAI: subtract), then logit_bias
    added (OpenAI: before temperature, so it moves greedy rows too)."""
    p = seq.params
    logits = logits.clone()
    device = logits.device
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(seq.token_ids)), dtype=torch.long, device=device)
        values = logits[seen]
        logits[seen] = torch.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
    output = seq.output_ids
    if output and (p.presence_penalty != 0.0 or p.frequency_penalty != 0.0):
        counts = torch.bincount(torch.tensor(output, dtype=torch.long), minlength=logits.numel()).to(device)
        logits -= p.frequency_penalty * counts.to(logits.dtype)
        logits -= p.presence_penalty * (counts > 0).to(logits.dtype)
    if p.logit_bias:  # after the penalties, as OpenAI adds it to the final logits
        ids = torch.tensor(list(p.logit_bias), dtype=torch.long, device=device)
        bias = torch.tensor(list(p.logit_bias.values()), dtype=logits.dtype, device=device)
        logits.index_add_(0, ids, bias)
    return logits


def filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Logits of one row with everything outside the top-k / nucleus set to -inf.

    The nucleus is found among the top candidates (256, then more while they hold less than
    top_p of the mass) rather than by sorting the whole vocabulary: the same set, less work."""
    V = logits.numel()
    if 0 < top_k < V:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        log_total = torch.logsumexp(logits, dim=-1)
        k = min(V, top_k if 0 < top_k < 256 else 256)
        while True:
            values, order = torch.topk(logits, k)  # descending
            probs = (values - log_total).exp()
            cumulative = torch.cumsum(probs, dim=-1)
            if k == V or float(cumulative[-1]) >= top_p:
                break
            k = min(V, k * 8)
        # Keep a token while the tokens before it hold less than top_p (the first always stays).
        keep = order[(cumulative - probs) < top_p]
        kept = torch.full_like(logits, float("-inf"))
        kept[keep] = logits[keep]
        logits = kept
    return logits


def draw(logits: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token per row of (scaled, filtered) logits [R, V], by inverse CDF with one uniform
    number per row from that row's CPU generator. Tokens of probability 0 are never drawn."""
    probs = torch.softmax(logits.float(), dim=-1)
    cdf = torch.cumsum(probs, dim=-1)  # non-decreasing: probabilities are >= 0
    uniform = torch.tensor([float(torch.rand((), generator=g)) for g in generators], dtype=torch.float32)
    target = uniform.to(cdf.device)[:, None] * cdf[:, -1:]
    # The first index whose cumulative mass exceeds the target: a zero-probability token adds
    # nothing to the sum, so it is never that index.
    chosen = torch.searchsorted(cdf, target, right=True).squeeze(1)
    # The target rounded up to the total (rare): the likeliest token. Always computed, never asked: asking
    # would wait for the device once more per step.
    return torch.where(chosen >= probs.shape[-1], probs.argmax(dim=-1), chosen)


TopLogprobs = list[tuple[int, float]]  # one step's k likeliest tokens, likeliest first


def sample(
    logits: torch.Tensor, seqs: list[Sequence], masks: TokenMasks | None = None
) -> tuple[list[int], list[float] | None, list[TopLogprobs] | None]:
    """Token ids for each row of logits [S, V] (fp32), plus their logprobs when any row asks, plus
    each row's top_logprobs alternatives when any row asks for them (an empty list for the others).
    `masks` forbids tokens in the rows it names (structured output)."""
    want_logprobs = any(s.params.logprobs for s in seqs)
    penalised = [i for i, s in enumerate(seqs) if needs_penalties(s)]
    work = logits
    if penalised:
        work = logits.clone()
        for i in penalised:
            work[i] = apply_penalties(logits[i], seqs[i])
    if masks is not None:
        work = masks.apply(work)
    rows = [i for i, s in enumerate(seqs) if s.params.temperature > 0]
    if len(rows) < len(seqs):
        chosen = work.argmax(dim=-1)
    else:
        chosen = torch.zeros(len(seqs), dtype=torch.long, device=logits.device)
    if rows:
        index = torch.tensor(rows, device=logits.device)
        temperature = torch.tensor([seqs[i].params.temperature for i in rows], device=logits.device)
        scaled = work.index_select(0, index) / temperature[:, None]
        filtered = [j for j, i in enumerate(rows) if seqs[i].params.top_k > 0 or seqs[i].params.top_p < 1.0]
        if filtered and filters_whole_batch(scaled.device.type):  # no host sync (Ascend's fused kernel where proven)
            at = torch.tensor(filtered, device=scaled.device)
            top_k = torch.tensor([seqs[rows[j]].params.top_k for j in filtered], device=scaled.device)
            top_p = torch.tensor([seqs[rows[j]].params.top_p for j in filtered], device=scaled.device)
            scaled = scaled.index_copy(0, at, fast_ops.top_k_top_p(scaled.index_select(0, at), top_k, top_p))
        else:
            for j in filtered:
                p = seqs[rows[j]].params
                scaled[j] = filter_top_k_top_p(scaled[j], p.top_k, p.top_p)
        chosen = chosen.index_copy(0, index, draw(scaled, [seqs[i].generator for i in rows]))
    if not want_logprobs:
        return chosen.tolist(), None, None
    all_logprobs = torch.log_softmax(logits, dim=-1)
    logprobs = all_logprobs.gather(1, chosen[:, None]).squeeze(1)
    # One copy to the host for ids and logprobs (fp32 logprobs as their bits: _bits).
    # The top_logprobs alternatives travel in the same copy: one topk over the batch at the largest k.
    k = max(s.params.top_logprobs if s.params.logprobs else 0 for s in seqs)
    parts = [chosen.to(torch.int64), _bits(logprobs)]
    if k > 0:
        values, ids = torch.topk(all_logprobs, k, dim=-1)
        parts += [ids.reshape(-1), _bits(values.reshape(-1))]
    host = torch.cat(parts).cpu()
    S = len(seqs)
    tokens, lps = host[:S].tolist(), _floats(host[S : 2 * S])
    tops = None
    if k > 0:  # cut per row
        top_ids, top_lps = host[2 * S : 2 * S + S * k].view(S, k).tolist(), _floats(host[2 * S + S * k :])
        tops = []
        for i, s in enumerate(seqs):
            row_k = s.params.top_logprobs if s.params.logprobs else 0
            tops.append(list(zip(top_ids[i][:row_k], top_lps[i * k : i * k + row_k], strict=True)))
    return tokens, lps, tops


def _bits(x: torch.Tensor) -> torch.Tensor:
    """fp32 values as their bits in int64, to travel beside ids in one copy and come back exact (no float64
    on the device: Ascend and MPS lack it)."""
    return x.float().view(torch.int32).to(torch.int64)


def _floats(bits: torch.Tensor) -> list[float]:
    return bits.to(torch.int32).view(torch.float32).tolist()
