"""Answer accuracy on held-out conversations: the evaluator hook of the chat stages.

The model answers each prompt (greedy, calculator on); a reply is right when its final answer equals
the expected one: "The answer is X." (the synthetic tasks), "#### X" (GSM8K) or the bare letter
(multiple choice). Each rank answers its share; the counts are summed over ranks.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from portachat.data.synthetic.tasks import extract_answer, final_segment, normalize_answer
from portachat.device import Device
from portachat.model import GPT
from portachat.tokenizer import Tokenizer, render_for_completion
from portachat.train.rollout import RolloutEngine


def reply_answer(reply: str) -> str | None:
    """The final answer a reply gives, in any of the accepted forms."""
    found = extract_answer(reply)
    if found is not None:
        return found
    text = final_segment(reply)
    if "####" in text:
        return text.rsplit("####", 1)[1].strip().split("\n", 1)[0]
    letter = re.fullmatch(r"\(?([A-J])\)?\.?", text.strip())
    return letter.group(1) if letter else None


def is_correct(reply: str, expected: str) -> bool:
    got = reply_answer(reply)
    return got is not None and normalize_answer(got) == normalize_answer(str(expected))


def answer_accuracy_evaluator(
    conversations: Sequence[dict[str, Any]],
    tokenizer: Tokenizer,
    dev: Device,
    max_tokens: int = 64,
    name: str = "accuracy",
    sampler: RolloutEngine | None = None,
):
    """An evaluator hook: fraction of `conversations` (each with "messages" and "answer") answered right.
    `sampler` shares an existing engine over the same model (RL) instead of building another. Either
    engine runs the weights in the device's inference dtype (rollout.RolloutEngine), not the fp32 master."""
    items = [c for c in conversations if c.get("answer") is not None]
    engines: dict[int, RolloutEngine] = {id(sampler.model): sampler} if sampler is not None else {}

    def evaluate(model: GPT, step: int) -> dict[str, float]:
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        mine = items[rank::world]
        prompts = [render_for_completion(tokenizer, c["messages"]) for c in mine]
        if id(model) not in engines:
            # A new model is a new evaluation copy (FSDP2's whole copy each time): drop the previous
            # one's engine and weights rather than keep every evaluation's alive.
            for key in [k for k in engines if sampler is None or k != id(sampler.model)]:
                del engines[key]
            engines[id(model)] = RolloutEngine(model, tokenizer, dev, max_num_seqs=max(1, min(len(mine), 32)))
        replies = engines[id(model)].sample(prompts, max_tokens, temperature=0.0, seeds=[0] * len(prompts))
        counts = torch.tensor([sum(is_correct(r.text, c["answer"]) for r, c in zip(replies, mine, strict=True)),
                               len(mine)], dtype=torch.int64, device=dev.torch_device)
        if world > 1:
            dist.all_reduce(counts)
        return {name: counts[0].item() / max(counts[1].item(), 1)}

    return evaluate
