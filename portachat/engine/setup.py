"""What an engine is built with: the weights' dtype and the number of KV-cache blocks that fit."""

from __future__ import annotations

import torch
from torch import nn

from portachat.device import Device
from portachat.device.dtypes import parse_dtype
from portachat.engine.config import EngineConfig
from portachat.engine.startup_memory import profiled_kv_budget
from portachat.i18n import _
from portachat.model.gpt import GPT
from portachat.ops.inference_dtype import inference_dtype
from portachat.ops.kv_quant import bytes_per_token
from portachat.quant import model_dtype


def weights_dtype(model: nn.Module, config: EngineConfig, device: Device) -> tuple[torch.dtype, str]:
    """The dtype the engine casts the weights to, and why. A model that is still training (RL
    rollouts) is never cast behind the trainer's back."""
    training = any(p.requires_grad for p in model.parameters())
    if config.dtype == "model" or (config.dtype is None and training):
        # model_dtype, not lm_head.weight: a quantized head has none
        return model_dtype(model), "kept the model's dtype" + (" (its weights are training)" if training else "")
    if config.dtype is not None:
        return parse_dtype(config.dtype), f"requested ({config.dtype})"
    choice = inference_dtype(device)
    return choice.value, choice.reason


def kv_blocks(model: GPT, config: EngineConfig, device: Device, dtype: torch.dtype, kv_dtype: torch.dtype,
              max_model_len: int) -> tuple[int, str]:  # fmt: skip
    """KV-cache blocks for the model: as requested, else what the device layer's budget allows once a
    profiling step at the largest batch (and the graph pool) have taken their memory."""
    cfg = model.config
    per_block = bytes_per_token(cfg.n_layer, cfg.n_kv_head, cfg.head_dim, kv_dtype) * config.block_size
    if config.num_blocks is not None:
        return config.num_blocks, _("{blocks} blocks requested").format(blocks=config.num_blocks)
    if config.kv_cache_gb is not None:
        return int(config.kv_cache_gb * 2**30) // per_block, f"--kv-cache-gb {config.kv_cache_gb}"
    wanted = config.max_num_seqs * -(-max_model_len // config.block_size) * per_block
    choice = profiled_kv_budget(device, model, config, max_model_len, dtype, kv_dtype, wanted)
    return int(choice.value) // per_block, choice.reason
