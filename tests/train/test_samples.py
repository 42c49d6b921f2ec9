"""Greedy samples at evaluations: the prompt plus the model's greedy text, through the engine."""

from __future__ import annotations

import torch

from portachat.device import get_device
from portachat.model import GPT, GPTConfig
from portachat.train.samples import greedy_samples


def small_gpt(vocab_size: int) -> GPT:
    cfg = GPTConfig(vocab_size=vocab_size, n_layer=2, n_embd=64, n_head=4, n_kv_head=2, head_dim=16,
                    intermediate_size=128, max_seq_len=32)
    model = GPT(cfg)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # every weight random (init zeroes some): the text varies with context
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.5 + (1.0 if p.dim() == 1 else 0.0))
    return model.train()


@torch.inference_mode()
def full_forward_greedy(model: GPT, ids: list[int], max_tokens: int, stop: set[int]) -> list[int]:
    out: list[int] = []
    while len(out) < max_tokens:
        out.append(int(model(torch.tensor([ids + out]))[0, -1].argmax()))
        if out[-1] in stop:
            break
    return out


def test_samples_are_greedy_continuations_and_training_goes_on(small_tokenizer):
    tok = small_tokenizer
    model = small_gpt(tok.vocab_size)
    prompts = ["To be, or not", "the"]
    dev = get_device("cpu")
    samples = greedy_samples(model, tok, prompts, 40, dev)  # 40 tokens run past the 32-token context
    assert greedy_samples(model, tok, prompts, 40, dev) == samples
    stop = {tok.bos_id, tok.eos_id}
    for prompt, sample in zip(prompts, samples, strict=True):
        new = full_forward_greedy(model, tok.encode(prompt, prepend_bos=True), 40, stop)
        assert sample == prompt + tok.decode([t for t in new if t not in stop]) and len(sample) > len(prompt)
    assert model.training and all(p.requires_grad for p in model.parameters())
    model(torch.tensor([[1, 2, 3]]), torch.tensor([[2, 3, 4]])).backward()  # still trains afterwards
    assert greedy_samples(model, tok, prompts, 0, dev) == prompts
