"""Whole-tensor views of FSDP2-sharded models for checkpoints: gather to write, scatter to load.

A checkpoint holds whole tensors whatever the layout it was trained in, so a run saved on N
processes resumes on M (and the model directory loads in transformers as it is).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, distribute_tensor

from portachat.i18n import _
from portachat.model import GPT
from portachat.model.model_dir import WEIGHTS, load_weights_into
from portachat.storage.atomic import CheckpointError


def is_sharded(model: torch.nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def full_model(model: GPT) -> GPT:
    """A model whose state_dict() holds whole tensors: the model itself unless sharded. Sharded, the
    weights are all-gathered to CPU (a collective: every rank calls it) into a copy used for writing."""
    if not is_sharded(model):
        return model
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    with torch.device("meta"):
        copy = GPT(model.config)
    if state:  # rank 0 (cpu_offload leaves the others empty)
        copy.load_state_dict(state, strict=False, assign=True)
        if model.config.tie_embeddings:
            copy.lm_head.weight = copy.model.embed_tokens.weight
    return copy


def whole_copy(model: GPT) -> GPT:
    """A plain (unsharded) copy of a sharded model's weights on its device, on every rank (a collective).

    Evaluation runs on it: each rank can then generate and score its own examples, with no collective
    inside the forward for ranks to disagree about."""
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    with torch.device("meta"):
        copy = GPT(model.config)
    copy.load_state_dict(state, strict=False, assign=True)
    if model.config.tie_embeddings:
        copy.lm_head.weight = copy.model.embed_tokens.weight
    copy.rope_cos, copy.rope_sin = model.rope_cos, model.rope_sin  # buffers are not sharded
    return copy.train(model.training)


def load_weights(model: GPT, path: Path) -> None:
    """A checkpoint's whole weights into `model`, sharded or not (every rank reads the file)."""
    if not is_sharded(model):
        load_weights_into(model, path)
        return
    state = load_file(str(Path(path) / WEIGHTS), device="cpu")
    if model.config.tie_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    missing = [name for name, _ in model.named_parameters() if name not in state]
    if missing:
        raise CheckpointError(_("{path} does not match its config: missing {names}").format(
            path=Path(path) / WEIGHTS, names=missing[:5]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(scatter_like(state[name], p))


def scatter_like(whole: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`whole` laid out as `like`: this rank's shard when `like` is a DTensor (no communication)."""
    whole = whole.to(device=like.device, dtype=like.dtype)
    if isinstance(like, DTensor):
        return distribute_tensor(whole, like.device_mesh, like.placements, src_data_rank=None)
    return whole
