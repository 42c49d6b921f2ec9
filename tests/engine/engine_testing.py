"""Tiny real parts for the engine tests: a trained BPE tokenizer behind the ChatTokenizer protocol
and small random GPTs (a uniquely named module: every tests/ folder may have a conftest)."""

from __future__ import annotations

from typing import Any

import torch

from portachat.device import get_device
from portachat.engine import EngineConfig, LLMEngine
from portachat.model import GPT, GPTConfig
from portachat.tokenizer.bpe import (
    ASSISTANT_END,
    OUTPUT_END,
    OUTPUT_START,
    PYTHON_END,
    PYTHON_START,
    Tokenizer,
    _byte_decoder,
)
from portachat.tokenizer.chat import render_for_completion
from portachat.tokenizer.protocol import ToolTokens


class OurChatTokenizer:
    """Our BPE tokenizer seen through the ChatTokenizer protocol (until the shared adapter lands)."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        self._byte_of = _byte_decoder()
        self._specials = set(tok.special_ids.values())

    @property
    def vocab_size(self) -> int:
        return self.tok.vocab_size

    @property
    def bos_id(self) -> int:
        return self.tok.bos_id

    @property
    def stop_ids(self) -> set[int]:
        return {self.tok.special_ids[ASSISTANT_END]}

    @property
    def tool_tokens(self) -> ToolTokens:
        s = self.tok.special_ids
        return ToolTokens(s[PYTHON_START], s[PYTHON_END], s[OUTPUT_START], s[OUTPUT_END])

    @property
    def chat_template(self) -> str | None:
        return None  # our chat format, rendered in code

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode([i for i in ids if i not in self._specials])

    def token_bytes(self, token_id: int) -> bytes:
        if token_id in self._specials:
            return b""
        return bytes(self._byte_of[c] for c in self.tok.id_to_token(token_id))

    def render_prompt(self, messages: list[dict[str, Any]]) -> list[int]:
        return render_for_completion(self.tok, messages)


def tiny_model(vocab_size: int, seed: int = 0, n_layer: int = 2, **overrides) -> GPT:
    """2 layers, width 64, GQA (4 heads over 2), every weight random so outputs vary with context."""
    cfg = dict(
        vocab_size=vocab_size,
        n_layer=n_layer,
        n_embd=64,
        n_head=4,
        n_kv_head=2,
        head_dim=16,
        intermediate_size=128,
        max_seq_len=256,
    )
    cfg.update(overrides)
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**cfg))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.5 + (1.0 if p.dim() == 1 else 0.0))
    return model.eval()


@torch.inference_mode()
def plain_greedy(
    model: GPT, prompt: list[int], max_tokens: int, stop_ids: set[int] = frozenset()
) -> list[int]:
    """Reference: greedy decoding by full forwards over the whole sequence (no cache at all)."""
    ids = list(prompt)
    out: list[int] = []
    for _ in range(max_tokens):
        logits = model(torch.tensor([ids]))[0, -1]
        token = int(logits.argmax())
        out.append(token)
        ids.append(token)
        if token in stop_ids:
            break
    return out


@torch.inference_mode()
def plain_logprobs(model: GPT, prompt: list[int], output: list[int]) -> list[float]:
    ids = torch.tensor([prompt + output])
    logp = torch.log_softmax(model(ids)[0].float(), dim=-1)
    return [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(output)]


def make_engine(tokenizer, model=None, **config) -> LLMEngine:
    model = model or tiny_model(tokenizer.vocab_size)
    base = dict(dtype="fp32", num_blocks=64, block_size=4, max_num_batched_tokens=16, compile=False)
    base.update(config)
    return LLMEngine(model, tokenizer, EngineConfig(**base), device=get_device("cpu"))


def prompts_of(lengths: list[int], vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab - 20, (n,), generator=g).tolist() for n in lengths]
