"""Next-token choice for a batch of sequences, each with its own sampling parameters.

Order (as HF/vLLM): penalties on the raw logits, then temperature, top-k, top-p, then a draw.
Greedy rows (temperature 0) take the argmax of the penalised logits. Draws use each request's own
CPU generator on CPU probabilities, so a seed gives the same tokens on every device and whatever
else is in the batch. Reported logprobs are the model's own (log_softmax of the raw logits).
"""

from __future__ import annotations

import torch

from portachat.serve.engine.sequence import Sequence


def needs_penalties(seq: Sequence) -> bool:
    p = seq.params
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0


def apply_penalties(logits: torch.Tensor, seq: Sequence) -> torch.Tensor:
    """Penalised copy of one row [V]: repetition over prompt + output (HF: divide positive logits,
    multiply negative ones), presence/frequency over the output (OpenAI: subtract)."""
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
    return logits


def filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Logits of one row with everything outside the top-k / nucleus set to -inf."""
    if 0 < top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the tokens before it already reach top_p (the first always stays).
        drop = (torch.cumsum(probs, dim=-1) - probs) >= top_p
        logits = logits.index_put((order[drop],), torch.tensor(float("-inf"), device=logits.device))
    return logits


def sample(logits: torch.Tensor, seqs: list[Sequence]) -> tuple[list[int], list[float] | None]:
    """Token ids for each row of logits [S, V] (fp32), plus their logprobs when any row asks."""
    want_logprobs = any(s.params.logprobs for s in seqs)
    chosen = logits.argmax(dim=-1)
    rows_to_fix = [i for i, s in enumerate(seqs) if needs_penalties(s) or s.params.temperature > 0]
    if rows_to_fix:
        chosen = chosen.clone()
    for i in rows_to_fix:
        seq = seqs[i]
        p = seq.params
        row = apply_penalties(logits[i], seq) if needs_penalties(seq) else logits[i]
        if p.temperature == 0:
            chosen[i] = row.argmax()
            continue
        row = filter_top_k_top_p(row / p.temperature, p.top_k, p.top_p)
        probs = torch.softmax(row, dim=-1).cpu()
        chosen[i] = int(torch.multinomial(probs, 1, generator=seq.generator))
    if not want_logprobs:
        return chosen.tolist(), None
    logprobs = torch.log_softmax(logits, dim=-1).gather(1, chosen[:, None]).squeeze(1)
    both = torch.stack([chosen.to(torch.float64), logprobs.to(torch.float64)]).cpu()
    return [int(t) for t in both[0].tolist()], both[1].tolist()
