"""The model a fine-tuning stage starts from (SFT/mid, DPO, GRPO, distillation, compress's healing):
a Hugging Face directory or a GGUF of the Llama / SmolLM2, Qwen2, Qwen3 families, or one of our
checkpoints, loaded trainable in fp32 with its own tokenizer and chat template.

Loss masks come from that template (portachat.tokenizer.template_masks); one of our checkpoints keeps
our chat format.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from portachat.device import Device
from portachat.model import GPT
from portachat.model.load import load_for_inference
from portachat.model.source import PEFT, PORTACHAT, is_portachat_dir, resolve
from portachat.tokenizer import Tokenizer, render_conversation
from portachat.tokenizer.chat import render_for_completion
from portachat.tokenizer.template_masks import render_template_conversation, render_template_prompt
from portachat.train.stage import Render


@dataclass
class BaseModel:
    model: GPT  # fp32, trainable, on the device
    tokenizer: Any  # our Tokenizer or the model's TemplateChatTokenizer (both save next to a checkpoint)
    render: Render
    prompt: Callable[[Any], list[int]]  # messages -> ids asking for the next assistant reply
    generation: dict[str, Any]
    path: Path


def load_base(spec: str | Path, dev: Device) -> BaseModel:
    """The model to fine-tune, in fp32 on the device (autocast gives the compute dtype), with its tokenizer."""
    source = resolve(spec)
    path = source.path
    loaded = load_for_inference(source, device=dev.torch_device, dtype=torch.float32)
    model = loaded.model
    model.requires_grad_(True)
    if model.config.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.train()
    gen = loaded.generation
    generation = {k: v for k, v in vars(gen).items() if v is not None and k != "max_new_tokens"}
    if source.format == PORTACHAT or (source.format == PEFT and is_portachat_dir(path)):  # a LoRA run of ours
        tok = Tokenizer.load(path)
        return BaseModel(model, tok, lambda m, n: render_conversation(tok, m, n),
                         lambda m: render_for_completion(tok, m), generation, path)
    tok = loaded.tokenizer
    return BaseModel(model, tok, lambda m, n: render_template_conversation(tok, m, n),
                     lambda m: render_template_prompt(tok, m), generation, path)


def pad_id(tokenizer: Any) -> int:
    """Any id the model embeds: padded positions are never targets and come after the real tokens."""
    if tokenizer.bos_id is not None:
        return tokenizer.bos_id
    eos = tokenizer.eos_id
    return eos if isinstance(eos, int) else eos[0]
