"""Perplexity on held-out text barely moves under int8 on a model that has learned something."""

from __future__ import annotations

import math

import pytest
import torch

from portachat.device.probe import ProbeResult
from portachat.device.quantization import decide_quantization
from portachat.model import GPT, GPTConfig
from portachat.quant import quantize_model

CPU = ProbeResult(kind="cpu", device_type="cpu", names=["cpu"])
SEQ = 64


@pytest.fixture(scope="module")
def trained(shakespeare_path, small_tokenizer):
    text = shakespeare_path.read_text(encoding="utf-8")
    train_ids = torch.tensor(small_tokenizer.encode(text[:60_000]))
    held_out = torch.tensor(small_tokenizer.encode(text[-8_000:]))
    cfg = GPTConfig(vocab_size=384, n_layer=1, n_embd=64, n_head=2, n_kv_head=1, head_dim=32,
                    intermediate_size=192, max_seq_len=SEQ)  # fmt: skip
    torch.manual_seed(0)
    model = GPT(cfg)
    model.init_weights(seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(30):
        starts = torch.randint(0, len(train_ids) - SEQ - 1, (8,), generator=generator)
        batch = torch.stack([train_ids[s : s + SEQ + 1] for s in starts.tolist()])
        loss = model(batch[:, :-1], targets=batch[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    n = (len(held_out) - 1) // SEQ * SEQ
    return model.eval(), held_out[: n + 1]


def held_out_ppl(model: GPT, ids: torch.Tensor) -> float:
    inputs, targets = ids[:-1].view(-1, SEQ), ids[1:].view(-1, SEQ)
    with torch.inference_mode():
        return math.exp(float(model(inputs, targets=targets)))


def test_int8_perplexity_rises_at_most_2_percent_int4_stays_close(trained):
    import copy

    model, ids = trained
    base = held_out_ppl(model, ids)
    assert base < 0.5 * 384  # it learned something: far below a uniform guess
    int8 = copy.deepcopy(model)
    quantize_model(int8, "int8", plan=decide_quantization(CPU, "int8", cpu_capability="AVX512"))
    int4 = copy.deepcopy(model)
    quantize_model(int4, "int4", plan=decide_quantization(CPU, "int4", cpu_capability="AVX512"))
    rise8, rise4 = held_out_ppl(int8, ids) / base - 1, held_out_ppl(int4, ids) / base - 1
    print(f"held-out perplexity {base:.2f}: int8 {100 * rise8:+.2f}%, int4 {100 * rise4:+.2f}%")
    assert rise8 <= 0.02 and rise4 <= 0.10
