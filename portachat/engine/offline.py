"""Offline batches: prompts in, finished completions out, in order (`LLMEngine.generate`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from portachat.engine.types import EngineError, RequestOutput, SamplingParams
from portachat.i18n import _


@dataclass
class Completion:
    """A finished request, as `generate` returns it."""

    text: str
    token_ids: list[int]
    finish_reason: str | None
    logprobs: list[float] | None
    prompt_tokens: int
    completion_tokens: int
    error: str | None = None


def generate(
    engine: Any,
    prompts: list[list[int]],
    params: SamplingParams | list[SamplingParams] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[Completion]:
    """Run prompts to completion on `engine` (an LLMEngine), queued as its queue bound allows, and
    return them in order. A prompt the engine refuses (too long, bad parameters) comes back with
    finish_reason "error" and the reason in `error`; the others run normally."""
    params = params or SamplingParams()
    plist = params if isinstance(params, list) else [params] * len(prompts)
    if len(plist) != len(prompts):
        raise EngineError(_("{prompts} prompts but {params} sampling params").format(
            prompts=len(prompts), params=len(plist)), kind="invalid")
    results: dict[str, dict] = {}
    order: list[str] = []
    pending = list(zip(prompts, plist, strict=True))
    done = 0
    while pending or engine.has_unfinished():
        while pending and len(engine.scheduler.waiting) < engine.config.max_waiting:
            prompt, p = pending.pop(0)
            try:
                rid = engine.add_request(prompt, p)
            except EngineError as exc:  # one bad prompt (e.g. too long) fails alone, not the batch
                rid = f"rejected-{len(order)}"
                refused = RequestOutput(rid, "", [], None, True, "error", str(exc), len(prompt), 0)
                results[rid] = {"text": [], "ids": [], "logprobs": None, "out": refused}
                order.append(rid)
                done += 1
                continue
            order.append(rid)
            results[rid] = {"text": [], "ids": [], "logprobs": [] if p.logprobs else None, "out": None}
        for out in engine.step():
            r = results.get(out.request_id)
            if r is None:
                continue
            r["text"].append(out.text)
            r["ids"].extend(out.token_ids)
            if r["logprobs"] is not None and out.logprobs:
                r["logprobs"].extend(out.logprobs)
            if out.finished:
                r["out"] = out
                done += 1
                if progress is not None:
                    progress(done, len(prompts))
    completions = []
    for rid in order:
        r = results[rid]
        out = r["out"]
        completions.append(
            Completion(
                text="".join(r["text"]),
                token_ids=r["ids"],
                finish_reason=out.finish_reason,
                logprobs=r["logprobs"],
                prompt_tokens=out.prompt_tokens,
                completion_tokens=out.completion_tokens,
                error=out.error,
            )
        )
    return completions
