"""Single-sequence generation through the KV cache (training samples, quick checks).

Serving's continuous-batching engine lives elsewhere; this is the plain loop. Sampling runs on
the CPU with a CPU generator, so a seed gives the same tokens on every device for the same logits.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from portachat.model.gpt import GPT
from portachat.model.kv_cache import KVCache


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> int:
    """Pick one token from logits [V]: argmax when temperature is 0, else top-k sampling."""
    if temperature == 0.0:
        return int(logits.argmax())
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.size(-1):
        values, indices = torch.topk(logits, top_k)
        probs = torch.softmax(values, dim=-1).cpu()
        return int(indices.cpu()[torch.multinomial(probs, 1, generator=generator)])
    probs = torch.softmax(logits, dim=-1).cpu()
    return int(torch.multinomial(probs, 1, generator=generator))


def generate(
    model: GPT,
    prompt_ids: list[int],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int | None = None,
    stop_ids: set[int] | None = None,
) -> Iterator[int]:
    """Yield up to `max_new_tokens` new token ids after `prompt_ids` (temperature 0 = greedy).

    Stops after yielding a token in `stop_ids`. Runs under inference mode with the model's own
    weight dtype; wrap the call in the device's autocast to generate in reduced precision.
    """
    if not prompt_ids:
        raise ValueError("prompt_ids is empty: give at least one token (e.g. the BOS token)")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be a positive integer or None, got {top_k}")
    if max_new_tokens == 0:
        return
    from portachat.quant import model_device, model_dtype  # a quantized model has no embed_tokens.weight

    device, dtype = model_device(model), model_dtype(model)
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    stop_ids = stop_ids or set()
    # Inference mode is entered per step, never across a `yield`: the caller's code between tokens
    # (often a training loop) must not run inside it.
    with torch.inference_mode():
        # The last sampled token is never fed back, hence the -1.
        cache = KVCache.for_model(
            model.config, 1, len(prompt_ids) + max_new_tokens - 1, device=device, dtype=dtype
        )
        idx = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    for i in range(max_new_tokens):
        with torch.inference_mode():
            logits = model(idx, kv_cache=cache, last_only=True)[0, -1]
            token = sample_next(logits, temperature, top_k, generator)
        yield token
        if token in stop_ids or i == max_new_tokens - 1:
            return
        idx = torch.tensor([[token]], dtype=torch.long, device=device)
