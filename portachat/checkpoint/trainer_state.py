"""Resumable trainer state: optimizer moments, RNG streams and data positions.

Stored next to the model files as safetensors + JSON (never pickle):
  trainer_state/optimizer.safetensors   moments, keyed "<optimizer>/<parameter name>/<state key>"
  trainer_state/optimizer.json          hyper-parameters and non-tensor state, grad-scaler state
  trainer_state/rank<R>.safetensors     that rank's CPU and device RNG states
Data positions live in portachat.json (one entry per data stream).

Moments are saved whole: replicated (DDP) state is rank 0's, FSDP2 shards are all-gathered first
and split again on load, so a run resumes on any number of devices. (torch.distributed.checkpoint's
default file format unpickles its metadata, which the checkpoint rules forbid.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from portachat.i18n import _
from portachat.storage.atomic import CheckpointError

STATE_DIR = "trainer_state"
# Hyper-parameters the command line sets: on resume they come from the new run, not the checkpoint.
# (The per-step `lr` and Muon `momentum` are recomputed by the schedule every step anyway.)
CONFIGURED_KEYS = frozenset({"lr", "initial_lr", "weight_decay", "betas", "eps"})


def _param_names(model: nn.Module) -> dict[int, str]:
    return {id(p): name for name, p in model.named_parameters()}


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, torch.dtype):
        return str(value)
    return value


def collect_optimizers(
    model: nn.Module, optimizers: list[torch.optim.Optimizer], scaler_state: dict | None
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Optimizer state as whole CPU tensors keyed by parameter name, plus its JSON part.

    FSDP2 keeps moments as DTensor shards: they are all-gathered here, so with a sharded model every
    rank must call this (a collective); the saved state is the same as a replicated run's."""
    names = _param_names(model)
    tensors: dict[str, torch.Tensor] = {}
    info: dict[str, Any] = {"optimizers": [], "grad_scaler": scaler_state}
    for i, opt in enumerate(optimizers):
        sd = opt.state_dict()
        order = [names[id(p)] for group in opt.param_groups for p in group["params"]]
        extra: dict[str, dict[str, Any]] = {}
        for idx, pstate in sd["state"].items():
            for key, value in pstate.items():
                if isinstance(value, torch.Tensor):
                    whole = value.full_tensor() if isinstance(value, DTensor) else value
                    tensors[f"{i}/{order[idx]}/{key}"] = whole.detach().to("cpu").contiguous()
                else:
                    extra.setdefault(order[idx], {})[key] = _jsonable(value)
        groups = [{k: _jsonable(v) for k, v in g.items() if k != "params"} for g in sd["param_groups"]]
        info["optimizers"].append({"type": type(opt).__name__, "param_groups": groups, "non_tensor_state": extra})
    return tensors, info


def write_optimizers(directory: Path, tensors: dict[str, torch.Tensor], info: dict[str, Any]) -> None:
    out = directory / STATE_DIR
    out.mkdir(exist_ok=True)
    save_file(tensors, str(out / "optimizer.safetensors"))
    (out / "optimizer.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")


def load_optimizers(directory: Path, model: nn.Module, optimizers: list[torch.optim.Optimizer]) -> dict | None:
    """Restore optimizer state in place; returns the saved grad-scaler state (or None)."""
    src = directory / STATE_DIR
    if not (src / "optimizer.json").is_file() or not (src / "optimizer.safetensors").is_file():
        raise CheckpointError(_("{path} has no trainer state to resume from (it may be a final or exported model)").format(
            path=directory))
    info = json.loads((src / "optimizer.json").read_text(encoding="utf-8"))
    tensors = load_file(str(src / "optimizer.safetensors"), device="cpu")
    if len(info["optimizers"]) != len(optimizers):
        raise CheckpointError(_("{path}: saved {saved} optimizers, this run has {count}").format(
            path=directory, saved=len(info["optimizers"]), count=len(optimizers)))
    names = _param_names(model)
    params = dict(model.named_parameters())
    for i, (opt, saved) in enumerate(zip(optimizers, info["optimizers"], strict=True)):
        sd = opt.state_dict()
        if saved["type"] != type(opt).__name__ or len(saved["param_groups"]) != len(sd["param_groups"]):
            raise CheckpointError(_("{path}: optimizer {index} is a {type} with other parameter groups").format(
                path=directory, index=i, type=saved["type"]))
        order = [names[id(p)] for group in opt.param_groups for p in group["params"]]
        state: dict[int, dict[str, Any]] = {}
        for idx, name in enumerate(order):
            pstate = {key.split("/", 2)[2]: _like_param(t, params[name])
                      for key, t in tensors.items() if key.startswith(f"{i}/{name}/")}
            pstate.update(saved["non_tensor_state"].get(name, {}))
            if pstate:
                state[idx] = pstate
        for group, saved_group in zip(sd["param_groups"], saved["param_groups"], strict=True):
            for key, value in saved_group.items():
                if key in CONFIGURED_KEYS:  # the resuming run's flags win (e.g. a lower lr after divergence)
                    continue
                group[key] = tuple(value) if isinstance(group.get(key), tuple) else value
        sd["state"] = state
        opt.load_state_dict(sd)
    return info.get("grad_scaler")


def _like_param(t: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """A saved whole moment laid out as its parameter: this rank's shard of it under FSDP2 (so state
    saved by any number of processes loads on any other). Scalars (Adam's step) stay as they are."""
    if isinstance(p, DTensor) and t.shape == p.shape:
        return distribute_tensor(t.to(p.device), p.device_mesh, p.placements, src_data_rank=None)
    return t


def save_rng(directory: Path, rank: int, rng: dict[str, torch.Tensor]) -> None:
    out = directory / STATE_DIR
    out.mkdir(exist_ok=True)
    save_file({k: v.contiguous() for k, v in rng.items()}, str(out / f"rank{rank}.safetensors"))


def load_rng(directory: Path, rank: int) -> dict[str, torch.Tensor] | None:
    path = directory / STATE_DIR / f"rank{rank}.safetensors"
    return load_file(str(path), device="cpu") if path.is_file() else None
