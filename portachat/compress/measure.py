"""Before/after numbers for a compressed model: parameters, perplexity on held-out rows of the
calibration data, GSM8K accuracy (optional), and single-stream greedy decode speed through the
inference engine on this device."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch

from portachat.device import Device
from portachat.engine.oneshot import engine_for, eval_mode
from portachat.engine.types import SamplingParams
from portachat.eval.generation import as_chat_tokenizer, model_complete
from portachat.eval.gsm8k import evaluate_gsm8k, read_gsm8k
from portachat.train.base_model import BaseModel, load_base

DECODE_PROMPT = "Once upon a time"


@dataclass
class ModelNumbers:
    params: int
    layers: int
    perplexity: float
    gsm8k_accuracy: float | None
    decode_tok_s: float

    def to_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


@torch.no_grad()
def perplexity(base: BaseModel, batches: list[torch.Tensor]) -> float:
    model = base.model
    total, tokens = 0.0, 0
    for idx in batches:
        idx = idx.to(model.lm_head.weight.device)
        total += float(model(idx[:, :-1], idx[:, 1:], loss_reduction="sum"))
        tokens += idx[:, 1:].numel()
    return math.exp(total / max(tokens, 1))


def decode_speed(base: BaseModel, tokens: int) -> float:
    """Tokens per second of one greedy stream, timed on an engine already built and warmed up once
    (building it and the first step's one-off work are not decoding)."""
    tok = as_chat_tokenizer(base.tokenizer)
    prompt = tok.encode(DECODE_PROMPT)
    engine = engine_for(base.model, tok, max_num_seqs=1, max_model_len=len(prompt) + tokens)
    with eval_mode(base.model):
        engine.generate([prompt], [SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)])
        start = time.perf_counter()
        done = engine.generate([prompt], [SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)])
        seconds = time.perf_counter() - start
    return len(done[0].token_ids) / seconds


def measure_model(spec: str, dev: Device, batches_for, gsm8k: str | None, gsm8k_examples: int,
                  decode_tokens: int) -> ModelNumbers:
    """The numbers of the model at `spec`; `batches_for(base)` gives its held-out token rows."""
    base = load_base(spec, dev)
    base.model.requires_grad_(False)
    base.model.eval()
    accuracy = None
    if gsm8k:
        complete = model_complete(base.model, as_chat_tokenizer(base.tokenizer))
        accuracy = evaluate_gsm8k(complete, read_gsm8k(gsm8k, limit=gsm8k_examples), max_tokens=128).value
    return ModelNumbers(params=base.model.num_params(), layers=base.model.config.n_layer,
                        perplexity=perplexity(base, batches_for(base)), gsm8k_accuracy=accuracy,
                        decode_tok_s=decode_speed(base, decode_tokens))
