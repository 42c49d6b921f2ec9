"""Greedy samples printed at evaluations: a quick look at what the model writes."""

from __future__ import annotations

import torch

from portachat.device import Device
from portachat.model import GPT, generate
from portachat.tokenizer import Tokenizer


@torch.no_grad()
def greedy_samples(
    model: GPT, tokenizer: Tokenizer, prompts: list[str], max_tokens: int, dev: Device, seed: int
) -> list[str]:
    """Each prompt followed by the model's greedy continuation (stops at bos / end of turn)."""
    out = []
    stop = {tokenizer.bos_id, tokenizer.eos_id}
    was_training = model.training
    model.eval()
    for i, prompt in enumerate(prompts):
        ids = tokenizer.encode(prompt, prepend_bos=True)
        with dev.autocast():
            new = list(generate(model, ids, max_new_tokens=max_tokens, temperature=0.0, seed=seed + i, stop_ids=stop))
        out.append(prompt + tokenizer.decode([t for t in new if t not in stop]))
    model.train(was_training)
    return out
