from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import require_shared


@pytest.fixture(scope="session")
def humaneval_path() -> Path:
    return require_shared("humaneval.jsonl.gz")


@pytest.fixture(scope="session")
def gsm8k_test_path() -> Path:
    return require_shared("gsm8k/test.jsonl")


@pytest.fixture(scope="session")
def tool_model(small_tokenizer):
    """A tiny real GPT trained (seconds) on three calculator conversations until it reproduces them:
    it writes the tool call and the final answer; the tool output between them is never a training
    target, so it appears in a reply only when the generation loop runs the calculator."""
    import torch

    from portachat.model import GPT, GPTConfig
    from portachat.tokenizer.chat import render_conversation

    torch.manual_seed(0)
    convs = [
        [{"role": "user", "content": f"What is {a}+{b}?"},
         {"role": "assistant", "content": [{"type": "python", "text": f"{a}+{b}"},
                                           {"type": "python_output", "text": str(a + b)},
                                           {"type": "text", "text": f"The answer is {a + b}."}]}]
        for a, b in ((23, 58), (41, 17), (60, 35))
    ]
    rows = [render_conversation(small_tokenizer, c) for c in convs]
    width = max(len(ids) for ids, _ in rows)
    x = torch.zeros(len(rows), width - 1, dtype=torch.long)
    y = torch.full((len(rows), width - 1), -1, dtype=torch.long)
    for r, (ids, mask) in enumerate(rows):
        t = torch.tensor(ids)
        x[r, :len(ids) - 1] = t[:-1]
        y[r, :len(ids) - 1] = torch.where(torch.tensor(mask[1:]) == 1, t[1:], torch.tensor(-1))
    cfg = GPTConfig(vocab_size=small_tokenizer.vocab_size, n_layer=1, n_embd=64, n_head=4, n_kv_head=2,
                    head_dim=16, intermediate_size=128, max_seq_len=256)
    model = GPT(cfg)
    model.init_weights(seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(120):
        loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return model, convs
