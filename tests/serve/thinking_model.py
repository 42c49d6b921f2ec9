"""A tiny model of ours that really thinks: trained here, in a few seconds, on a few dozen ChatML
conversations whose replies are `<think>\\nREASONING\\n</think>\\n\\nANSWER`, with a Qwen3-style template
whose `enable_thinking=false` closes an empty block in the prompt (then the reply is the answer alone).
The server's reasoning split is then tested on what the engine really generates."""

from __future__ import annotations

from pathlib import Path

import torch

from portachat.model import GPT, GPTConfig
from portachat.tokenizer.chat_tokenizer import TemplateChatTokenizer

THINKING_CHATML = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
REASONING = "the fox is quick"
ANSWER = "hello there"
_WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jolly gnomes at dawn".split()


def thinking_tokenizer(directory: Path) -> TemplateChatTokenizer:
    from tests.model.hf_families import save_tokenizer, train_bpe
    from tests.serve.test_tool_calls import _ours

    save_tokenizer(train_bpe(), directory, chat_template=THINKING_CHATML)
    return _ours(directory)


def _rows(tok: TemplateChatTokenizer) -> list[tuple[list[int], list[int]]]:
    end = tok.end_ids[0]
    rows = []
    for i in range(32):
        messages = [{"role": "user", "content": " ".join(_WORDS[i % 12: i % 12 + 1 + i % 4])}]
        if i % 2:
            prompt = tok.render_prompt(messages, template_kwargs={"enable_thinking": False})
            reply = tok.encode(ANSWER) + [end]
        else:
            prompt = tok.render_prompt(messages)
            reply = tok.encode(f"<think>\n{REASONING}\n</think>\n\n{ANSWER}") + [end]
        rows.append((prompt, reply))
    return rows


def train_thinking_model(tok: TemplateChatTokenizer, steps: int = 150, seed: int = 0) -> GPT:
    """Depth 2, width 64, fit until greedy decoding reproduces the replies (asserted by the tests)."""
    return train_replies(tok.vocab_size, _rows(tok), steps, seed)


def train_replies(vocab_size: int, rows: list[tuple[list[int], list[int]]], steps: int, seed: int = 0) -> GPT:
    """A depth-2, width-64 GPT fit to write each row's reply ids after its prompt ids."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=vocab_size, n_layer=2, n_embd=64, n_head=4, n_kv_head=2, head_dim=16,
                          intermediate_size=128, max_seq_len=256))
    model.init_weights(seed)
    width = max(len(p) + len(r) for p, r in rows)
    idx = torch.zeros(len(rows), width, dtype=torch.long)
    targets = torch.full((len(rows), width), -1, dtype=torch.long)
    for i, (prompt, reply) in enumerate(rows):
        ids = prompt + reply
        idx[i, : len(ids)] = torch.tensor(ids)
        targets[i, len(prompt) - 1 : len(ids) - 1] = torch.tensor(reply)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    model.train()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small trains faster on one thread than on contended cores
    try:
        for _ in range(steps):
            loss = model(idx, targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval()
