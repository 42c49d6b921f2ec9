"""LoRA adapters as serving needs them: PEFT's files read without peft, and the low-rank math.

A PEFT LoRA adapter directory holds

    adapter_config.json          LoraConfig (r, lora_alpha, target_modules, use_rslora, ...)
    adapter_model.safetensors    base_model.model.<module>.lora_A.weight [r, in] / lora_B.weight [out, r]

and changes each target linear layer to W x + scaling * B (A x), scaling = alpha / r (alpha / sqrt(r)
with rsLoRA), as peft computes it. Our GPT names its modules as Hugging Face's Llama/Qwen do, so
the names match unchanged. Training an adapter (through peft) is train/lora.py's business; this
module only reads, checks and merges, so loading a model for serving never imports the trainer.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

from portachat.i18n import _
from portachat.model.config import ALL_LINEAR
from portachat.model.hf import UnsupportedConfigError
from portachat.model.source import resolve
from portachat.storage.atomic import CheckpointError

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # what PeftModelForCausalLM puts before the base model's names


@dataclass
class LoraOptions:
    rank: int = 16
    alpha: float = 32.0
    targets: list[str] = field(default_factory=lambda: list(ALL_LINEAR))
    dropout: float = 0.0

    def check(self) -> None:
        if self.rank <= 0:
            raise ValueError(_("--lora-rank must be positive, got {value}").format(value=self.rank))
        unknown = sorted(set(self.targets) - set(ALL_LINEAR))
        if unknown or not self.targets:
            raise ValueError(_("--lora-targets {targets}: choose from {choices}").format(
                targets=unknown or _("(none)"), choices=", ".join(ALL_LINEAR)))


@dataclass
class LoraModule:
    """One target layer's low-rank update, fp32: y = W x + B (A x), PEFT's scaling folded into B."""

    A: torch.Tensor  # [r, in]
    B: torch.Tensor  # [out, r], times scaling


@dataclass
class LoraWeights:
    """A whole adapter: module name (model.layers.N.self_attn.q_proj, ...) -> its update."""

    path: Path
    base_model: str | None  # peft's base_model_name_or_path
    modules: dict[str, LoraModule]

    @property
    def rank(self) -> int:
        return max(m.A.size(0) for m in self.modules.values())


def read_adapter(directory: str | Path) -> tuple[LoraOptions, dict[str, Any], dict[str, torch.Tensor]]:
    """(options, the raw config, the tensors) of a PEFT LoRA adapter directory; clear errors otherwise."""
    directory = Path(directory)
    config_path, weights_path = directory / ADAPTER_CONFIG, directory / ADAPTER_WEIGHTS
    if not config_path.is_file() or not weights_path.is_file():
        raise CheckpointError(
            _("{path} is not a LoRA adapter: it needs {config} and {weights} "
              "(what `portachat train sft --lora-rank R` and peft's save_pretrained write)").format(
                path=directory, config=ADAPTER_CONFIG, weights=ADAPTER_WEIGHTS)
        )
    try:
        raw = json.loads(config_path.read_text(encoding="utf-8"))
        tensors = load_file(str(weights_path), device="cpu")
    except (OSError, ValueError) as exc:
        raise CheckpointError(_("{path}: the adapter cannot be read ({error}); it is damaged").format(
            path=directory, error=exc)) from exc
    if raw.get("peft_type", "LORA") != "LORA" or raw.get("use_dora") or raw.get("modules_to_save"):
        raise CheckpointError(_("{path}: only plain LoRA adapters are supported (no DoRA, no modules_to_save)").format(
            path=directory))
    targets = raw.get("target_modules") or []
    targets = [targets] if isinstance(targets, str) else list(targets)
    opts = LoraOptions(rank=int(raw.get("r", 8)), alpha=float(raw.get("lora_alpha", 8)), targets=targets,
                       dropout=float(raw.get("lora_dropout", 0.0)))
    return opts, raw, tensors


def find_adapter_dir(spec: str | Path) -> Path:
    """The LoRA adapter directory `spec` names, found by the one model resolver (`source.resolve`): the
    adapter directory itself, a LoRA run's stage or run directory or its `latest` pointer file (the
    checkpoint `latest` points to), or RUN/STAGE under PORTACHAT_HOME."""
    try:
        path: Path | None = resolve(spec).path
    except (CheckpointError, UnsupportedConfigError):
        path = None  # nothing there, or a plain file: no adapter either way, and the advice below fits
    if path is not None and (path / ADAPTER_CONFIG).is_file():
        return path
    raise CheckpointError(_("--lora {spec}: no LoRA adapter there ({config} missing); pass the adapter "
                            "directory or the stage directory of a `train sft --lora-rank R` run").format(
        spec=spec, config=ADAPTER_CONFIG))


def _pattern_value(patterns: dict[str, Any], module: str, default: Any) -> Any:
    """peft's rank_pattern / alpha_pattern lookup: the first key matching the module name's tail."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def scaling(raw: dict[str, Any], module: str, rank: int) -> float:
    """PEFT's scaling for one module: lora_alpha / r, or / sqrt(r) with use_rslora."""
    alpha = float(_pattern_value(raw.get("alpha_pattern"), module, raw.get("lora_alpha", 8)))
    r = int(_pattern_value(raw.get("rank_pattern"), module, rank))
    return alpha / math.sqrt(r) if raw.get("use_rslora") else alpha / r


def load_lora(directory: str | Path) -> LoraWeights:
    """Read a PEFT LoRA adapter directory into fp32 per-module updates (never unpickles)."""
    directory = Path(directory)
    _opts, raw, tensors = read_adapter(directory)
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        m = re.fullmatch(rf"{re.escape(PEFT_PREFIX)}(.+)\.lora_([AB])(?:\.[^.]+)?\.weight", key)
        if m is None:
            raise CheckpointError(_("{path}: unexpected tensor {key} (only lora_A / lora_B weights are supported)").format(
                path=directory, key=key))
        pairs.setdefault(m.group(1), {})[m.group(2)] = t
    modules = {}
    for name, pair in sorted(pairs.items()):
        if set(pair) != {"A", "B"}:
            raise CheckpointError(_("{path}: {name} has lora_{half} without its partner").format(
                path=directory, name=name, half="".join(pair)))
        A, B = pair["A"].float(), pair["B"].float()
        if A.dim() != 2 or B.dim() != 2 or B.size(1) != A.size(0):
            raise CheckpointError(_("{path}: {name} has lora_A {a_shape} and lora_B {b_shape}, "
                                    "which do not multiply").format(
                path=directory, name=name, a_shape=tuple(A.shape), b_shape=tuple(B.shape)))
        modules[name] = LoraModule(A.contiguous(), (B * scaling(raw, name, A.size(0))).contiguous())
    if not modules:
        raise CheckpointError(_("{path}: the adapter holds no LoRA weights").format(path=directory))
    return LoraWeights(directory, raw.get("base_model_name_or_path"), modules)


def check_fits(lora: LoraWeights, model: nn.Module) -> None:
    """Every update names a linear layer of `model` with matching shapes; CheckpointError otherwise."""
    for name, m in lora.modules.items():
        try:
            layer = model.get_submodule(name)
        except AttributeError:
            layer = None
        # nn.Linear, or a weight-only quantized one (portachat.quant): both say their features
        if not hasattr(layer, "in_features") or not hasattr(layer, "out_features"):
            raise CheckpointError(_("{path}: the adapter changes {name}, which this model does not have "
                                    "as a linear layer (was it trained on another base model?)").format(
                path=lora.path, name=name))
        want = (layer.out_features, layer.in_features)
        if (m.B.size(0), m.A.size(1)) != want:
            raise CheckpointError(_("{path}: {name} maps {a_in} -> {a_out} features, this model's "
                                    "layer maps {in_features} -> {out_features} (was it trained on another base model?)").format(
                path=lora.path, name=name, a_in=m.A.size(1), a_out=m.B.size(0), in_features=want[1], out_features=want[0]))


@torch.no_grad()
def merge_into(model: nn.Module, lora: LoraWeights) -> nn.Module:
    """Fold the adapter into the weights in place: W += scaling * B A, computed in fp32."""
    check_fits(lora, model)
    for name, m in lora.modules.items():
        weight = getattr(model.get_submodule(name), "weight", None)
        if weight is None:
            raise CheckpointError(_("{path}: {name} is quantized; fold the adapter in before quantizing, or "
                                    "serve it unmerged (--lora NAME=PATH)").format(path=lora.path, name=name))
        weight.copy_((weight.float() + m.B.to(weight.device) @ m.A.to(weight.device)).to(weight.dtype))
    return model
