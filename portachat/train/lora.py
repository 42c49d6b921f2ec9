"""LoRA through `peft`: adapters on our GPT's linear layers, saved in PEFT's own format.

Our GPT names its modules as Hugging Face's Llama/Qwen do (model.layers.N.self_attn.q_proj, ...), so
peft's LoraConfig applies to it unchanged and the adapter it saves loads with
`PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter_dir)` (and in vLLM).

    adapter_config.json          peft's LoraConfig (task_type CAUSAL_LM, base_model_name_or_path)
    adapter_model.safetensors    base_model.model.<module>.lora_A.weight / lora_B.weight

Only the adapter trains: every base weight is frozen before peft adds lora_A / lora_B. Reading
adapter files and the low-rank math serving needs live in portachat/model/lora.py.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from portachat.i18n import _
from portachat.model.lora import (  # noqa: F401 - re-exported: the trainer's callers import them from here
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    ALL_LINEAR,
    PEFT_PREFIX,
    LoraModule,
    LoraOptions,
    LoraWeights,
    read_adapter,
)
from portachat.storage.atomic import CheckpointError
from portachat.train.accumulation import TrainingError

ADAPTER_NAME = "default"


def _peft() -> Any:
    try:  # optional dependency (the `models` extra): only LoRA's save and load need it
        import peft  # deferred: optional (the `models` extra)
    except ImportError as exc:
        raise ImportError(_("LoRA needs the `peft` package: pip install 'portachat[models]' (or pip install peft)")) from exc
    return peft


def lora_config(opts: LoraOptions, base_model: str | None = None) -> Any:
    LoraConfig = _peft().LoraConfig  # noqa: N806 - the class, by its name

    opts.check()
    return LoraConfig(r=opts.rank, lora_alpha=opts.alpha, target_modules=list(opts.targets), lora_dropout=opts.dropout,
                      bias="none", task_type="CAUSAL_LM", base_model_name_or_path=base_model)


def lora_from_flags(rank: int | None, alpha: float | None, targets: str, dropout: float) -> LoraOptions | None:
    """LoraOptions from the --lora-* flags (None without --lora-rank); TrainingError for bad values."""
    if not rank:
        return None
    opts = LoraOptions(rank=rank, alpha=alpha or 2.0 * rank, targets=[t.strip() for t in targets.split(",") if t.strip()],
                       dropout=dropout)
    try:
        opts.check()
    except ValueError as exc:
        raise TrainingError(str(exc)) from exc
    return opts


def add_lora(model: nn.Module, opts: LoraOptions) -> nn.Module:
    """Freeze `model` and add trainable LoRA adapters to the target linear layers (in place)."""
    model.requires_grad_(False)
    _peft().inject_adapter_in_model(lora_config(opts), model, adapter_name=ADAPTER_NAME)
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)
    return model


def has_lora(model: nn.Module) -> bool:
    return any(isinstance(m, _peft().tuners.lora.LoraLayer) for m in model.modules())


def _lora_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    lora_layer = _peft().tuners.lora.LoraLayer
    return [(name, m) for name, m in model.named_modules() if isinstance(m, lora_layer)]


def without_adapters(model: nn.Module) -> nn.Module:
    """The base model as its own module tree, every LoRA layer replaced by the layer it wraps: the
    same weight tensors and the same base linear modules (nothing is copied), so a frozen base runs
    through code that knows nothing of peft (the engine) while the adapter keeps training."""
    memo: dict[int, object] = {id(t): t for t in (*model.parameters(), *model.buffers())}
    for _name, layer in _lora_layers(model):
        memo[id(layer.get_base_layer())] = layer.get_base_layer()
    view = copy.deepcopy(model, memo)
    for name, layer in _lora_layers(view):
        parent_name, _, child = name.rpartition(".")
        setattr(view.get_submodule(parent_name), child, layer.get_base_layer())
    for attr in ("peft_config", "_hf_peft_config_loaded"):
        if hasattr(view, attr):
            delattr(view, attr)
    return view.requires_grad_(False)


@torch.no_grad()
def adapter_weights(model: nn.Module, path: str | Path = "(in training)") -> LoraWeights:
    """The adapter as it is now, as serving reads one: per module, fp32 A and B with peft's scaling
    folded into B (what the engine's batched LoRA takes)."""
    modules = {}
    for name, layer in _lora_layers(model):
        A, B = layer.lora_A[ADAPTER_NAME].weight, layer.lora_B[ADAPTER_NAME].weight
        modules[name] = LoraModule(A.detach().float().clone(), (B.detach().float() * layer.scaling[ADAPTER_NAME]))
    if not modules:
        raise ValueError("the model has no LoRA adapter")
    return LoraWeights(Path(path), None, modules)


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """The base model's forward inside the block (every LoRA layer off), the same weights, no copy: the
    frozen reference preference losses compare against. Gradients flags are left alone (peft's own switch,
    `enable_adapters(False)`, also freezes the adapter and its re-enabling would unfreeze whatever it names)."""
    layers = [m for m in model.modules() if isinstance(m, _peft().tuners.lora.LoraLayer)]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer in layers:
            layer._disable_adapters = False


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's whole tensors under the names peft saves them with. Under FSDP2 each rank holds a
    shard of every matrix: they are all-gathered here, so every rank must call this (a collective)."""
    out = {}
    for name, p in model.named_parameters():
        if ".lora_" in name:
            whole = p.full_tensor() if isinstance(p, DTensor) else p
            out[PEFT_PREFIX + name.replace(f".{ADAPTER_NAME}.", ".")] = whole.detach().to("cpu").contiguous()
    if not out:
        raise ValueError("the model has no LoRA adapter to save")
    return out


def save_adapter(directory: Path, tensors: dict[str, torch.Tensor], opts: LoraOptions,
                 base_model: str | None = None) -> None:
    """Write adapter_config.json + adapter_model.safetensors (`tensors`: adapter_state_dict's) into
    `directory` (an existing temp dir)."""
    config = lora_config(opts, base_model).to_dict()
    config = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}
    save_file(tensors, str(Path(directory) / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    (Path(directory) / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def load_adapter(model: nn.Module, directory: str | Path) -> nn.Module:
    """Add the adapter saved in `directory` to `model` (in place), its weights loaded and checked."""
    opts, _raw, _tensors = read_adapter(directory)
    if has_lora(model):
        raise ValueError("the model already has a LoRA adapter")
    add_lora(model, opts)
    restore_adapter(model, directory)
    return model


def restore_adapter(model: nn.Module, directory: str | Path) -> None:
    """Copy the adapter saved in `directory` into `model`'s adapter of the same shape (a resumed LoRA run);
    under FSDP2 each rank keeps its shard of every saved matrix."""
    _opts, _raw, tensors = read_adapter(directory)
    ours = {name: p for name, p in model.named_parameters() if ".lora_" in name}
    expected = {PEFT_PREFIX + n.replace(f".{ADAPTER_NAME}.", "."): n for n in ours}
    missing, unexpected = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise CheckpointError(_("{directory}: the adapter does not fit this model: missing {missing}, "
                                "unexpected {unexpected} (was it trained on another base model?)").format(
            directory=directory, missing=missing[:3], unexpected=unexpected[:3]))
    with torch.no_grad():
        for key, name in expected.items():
            p, t = ours[name], tensors[key]
            if tuple(p.shape) != tuple(t.shape):
                raise CheckpointError(_("{directory}: {key} has shape {shape}, this model needs {needed}").format(
                    directory=directory, key=key, shape=tuple(t.shape), needed=tuple(p.shape)))
            if isinstance(p, DTensor):
                p.copy_(distribute_tensor(t.to(p.device, p.dtype), p.device_mesh, p.placements, src_data_rank=None))
            else:
                p.copy_(t)


@torch.no_grad()
def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter into its base weight and put the plain nn.Linear back: the model is then an
    ordinary GPT (same parameter names and forward as before the adapter was added)."""
    lora_layer = _peft().tuners.lora.LoraLayer
    for name, module in list(model.named_modules()):
        if isinstance(module, lora_layer):
            module.merge(safe_merge=True)
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name), child, module.get_base_layer())
    for attr in ("peft_config", "_hf_peft_config_loaded"):
        if hasattr(model, attr):
            delattr(model, attr)
    return model
