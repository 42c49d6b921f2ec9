"""Greedy samples printed at evaluations: a quick look at what the model writes."""

from __future__ import annotations

from portachat.device import Device
from portachat.engine import SamplingParams
from portachat.engine.oneshot import generate_once
from portachat.model import GPT
from portachat.tokenizer import Tokenizer
from portachat.tokenizer.chat_tokenizer import PortachatChatTokenizer
from portachat.train.engine_copy import engine_weights


def greedy_samples(model: GPT, tokenizer: Tokenizer, prompts: list[str], max_tokens: int, dev: Device) -> list[str]:
    """Each prompt followed by the model's greedy continuation (stops at bos / eos).

    Runs through the inference engine on a copy of the weights in the device's inference dtype, made
    for this call and freed after (the CPU runs the training model itself; weights and mode untouched);
    a continuation may run past the model's context."""
    if max_tokens < 1:
        return list(prompts)
    stop = [tokenizer.bos_id, tokenizer.eos_id]
    # Plain text, not a chat: no end-of-turn stop (ignore_eos), no calculator.
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, stop_token_ids=stop,
                            use_tools=False)
    ids = [tokenizer.encode(p, prepend_bos=True) for p in prompts]
    with engine_weights(model, dev) as weights:
        done = generate_once(weights, ids, params, PortachatChatTokenizer(tokenizer), dev)
    return [p + tokenizer.decode([t for t in c.token_ids if t not in stop]) for p, c in zip(prompts, done, strict=True)]
