"""Pieces of OpenAI's reply bodies: usage and the two logprobs shapes (chat's and the legacy one)."""

from __future__ import annotations

from typing import Any

from portachat.engine.scoring import PromptScores
from portachat.engine.types import RequestOutput
from portachat.serve.api.state import ModelLease


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def token_text(state: ModelLease, token_id: int) -> tuple[str, list[int]]:
    raw = state.model.tokenizer.token_bytes(token_id)
    try:
        return raw.decode("utf-8"), list(raw)
    except UnicodeDecodeError:  # part of a character split across tokens: show bytes, as vLLM does
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw), list(raw)


def chat_logprobs(state: ModelLease, token_ids: list[int], logprobs: list[float | None],
                  tops: list[list[tuple[int, float]]] | None = None) -> dict[str, Any]:
    content = []
    for i, (token_id, lp) in enumerate(zip(token_ids, logprobs, strict=True)):
        token, raw = token_text(state, token_id)
        alternatives = []
        for alt_id, alt_lp in (tops[i] if tops else []):
            alt, alt_raw = token_text(state, alt_id)
            alternatives.append({"token": alt, "logprob": alt_lp, "bytes": alt_raw})
        content.append({"token": token, "logprob": lp if lp is not None else 0.0, "bytes": raw,
                        "top_logprobs": alternatives})
    return {"content": content}


def completion_logprobs(state: ModelLease, token_ids: list[int], logprobs: list[float | None],
                        offset: int, tops: list[list[tuple[int, float]]] | None = None) -> dict[str, Any]:
    """OpenAI's legacy shape; top_logprobs (with logprobs=k > 0) maps each alternative's text to its logprob."""
    tokens, offsets = [], []
    for token_id in token_ids:
        token, _ = token_text(state, token_id)
        tokens.append(token)
        offsets.append(offset)
        offset += len(state.model.tokenizer.decode([token_id]))
    top = None
    if tops is not None:
        top = [{token_text(state, alt_id)[0]: alt_lp for alt_id, alt_lp in step} for step in tops]
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": top, "text_offset": offsets}

def prompt_logprobs(state: ModelLease, prompt_ids: list[int], scores: PromptScores) -> list[dict[str, Any] | None]:
    """vLLM's layout: None for the first prompt token, then per position {"<token id>": {"logprob", "rank",
    "decoded_token"}} for the top k and the prompt's own token (with its rank, whatever it is)."""
    out: list[dict[str, Any] | None] = [None]
    for i, token_id in enumerate(prompt_ids[1:]):
        entries = {str(t): {"logprob": lp, "rank": r + 1, "decoded_token": token_text(state, t)[0]}
                   for r, (t, lp) in enumerate(zip(scores.top_ids[i], scores.top_logprobs[i], strict=True))}
        entries.setdefault(str(token_id), {"logprob": scores.token_logprobs[i], "rank": scores.token_ranks[i],
                                           "decoded_token": token_text(state, token_id)[0]})
        out.append(entries)
    return out


def logprobs_of(output: RequestOutput) -> list[float | None]:
    values = list(output.logprobs or [])
    return values + [None] * (len(output.token_ids) - len(values))  # forced tool tokens have none


def tops_of(output: RequestOutput) -> list[list[tuple[int, float]]]:
    values = list(output.top_logprobs or [])
    return values + [[] for _ in range(len(output.token_ids) - len(values))]
