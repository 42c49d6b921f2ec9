from __future__ import annotations

import pytest
import torch

from portachat.model import generate, sample_next


def greedy_without_cache(model, prompt: list[int], n: int) -> list[int]:
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
    return seq[len(prompt) :]


def test_greedy_equals_uncached_argmax_loop(tiny_model):
    prompt = [3, 14, 15, 92, 65]
    assert list(generate(tiny_model, prompt, max_new_tokens=10, temperature=0.0)) == greedy_without_cache(
        tiny_model, prompt, 10
    )


def test_seeded_sampling_is_reproducible_and_seed_dependent(tiny_model):
    runs = [list(generate(tiny_model, [1, 2, 3], 16, temperature=1.0, seed=s)) for s in (7, 7, 8)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]
    assert all(len(r) == 16 and all(0 <= t < 128 for t in r) for r in runs)


def test_top_k_restricts_choices(tiny_model):
    logits = torch.arange(10, dtype=torch.float)
    picks = {
        sample_next(logits, temperature=5.0, top_k=2, generator=torch.Generator().manual_seed(i))
        for i in range(50)
    }
    assert picks == {8, 9}
    assert sample_next(logits, temperature=0.0) == 9
    # top_k=1 is greedy whatever the temperature
    assert list(generate(tiny_model, [5, 6], 6, temperature=2.0, top_k=1, seed=0)) == greedy_without_cache(
        tiny_model, [5, 6], 6
    )


def test_stop_ids_end_generation_after_yielding_the_stop_token(tiny_model):
    free = list(generate(tiny_model, [9, 8, 7], 12, temperature=0.0))
    stop = free[4]
    stopped = list(generate(tiny_model, [9, 8, 7], 12, temperature=0.0, stop_ids={stop}))
    assert stopped == free[: free.index(stop) + 1]


def test_generation_does_not_leak_inference_mode(tiny_model):
    stream = generate(tiny_model, [1, 2], 3, temperature=0.0)
    next(stream)
    assert not torch.is_inference_mode_enabled()  # the caller's code between tokens runs normally
    assert len(list(stream)) == 2


def test_zero_tokens_and_bad_arguments(tiny_model):
    assert list(generate(tiny_model, [1], 0)) == []
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        list(generate(tiny_model, [], 4))
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        list(generate(tiny_model, [1], 4, temperature=-1.0))
    with pytest.raises(ValueError, match="top_k must be a positive integer"):
        list(generate(tiny_model, [1], 4, top_k=0))
