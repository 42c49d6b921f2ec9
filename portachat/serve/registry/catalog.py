"""Which models a server offers: `--model name=PATH` entries and everything under `--models-dir`.

A model under the directory is anything `portachat.model.source.resolve` accepts (one of our
checkpoint runs, a Hugging Face model directory, a .gguf file), named by its folder or file stem
(as llama-server's router names them). A LoRA adapter (`--lora name=PATH`, or a PEFT directory
under `--models-dir` whose base_model_name_or_path is a served model) is an entry too: requests
name it as a model, and it runs on its base model's engine.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from portachat.i18n import _
from portachat.model.hf import UnsupportedConfigError
from portachat.model.source import ADAPTER, GGUF, ModelSource, resolve
from portachat.storage.atomic import CheckpointError


@dataclass(frozen=True)
class ModelSpec:
    name: str  # what requests send as `model`
    path: str  # what `load_for_inference` accepts
    pinned: bool = False  # given with --model: loaded at start-up
    base: str | None = None  # a LoRA adapter: the registry name of the model it runs on
    # What `path` resolved to when the entry was made (None: not resolved yet, or no model there).
    source: ModelSource | None = field(default=None, compare=False, repr=False)


def parse_model_arg(text: str) -> tuple[str | None, str]:
    """`name=PATH` -> (name, PATH); a bare PATH -> (None, PATH). A path with '=' in a folder name
    still works: only a name of word characters, dots, colons and dashes (no slash) counts."""
    name, sep, path = text.partition("=")
    if sep and path and re.fullmatch(r"[\w.:-]+", name):
        return name, path
    return None, text


def given_model(path: str, name: str | None = None) -> ModelSpec:
    """A `--model [NAME=]PATH` entry (loaded at start-up), resolved here once: its name, its size and
    the load itself all use that answer."""
    try:
        source = resolve(path)
    except (CheckpointError, UnsupportedConfigError, OSError):  # the load says what is wrong, in its context
        source = None
    return ModelSpec(name or (source.name if source else Path(path).name or path), path, pinned=True, source=source)


def discover_models(models_dir: str | Path) -> list[ModelSpec]:
    """Every model directly below `models_dir`, sorted by name: what `resolve` accepts (a run or
    stage directory stands for the checkpoint its `latest` names). A missing directory is an
    error (a typo should not start an empty server)."""
    root = Path(models_dir).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(_("--models-dir {models_dir}: no such directory").format(
                                  models_dir=models_dir))
    found = []
    for child in sorted(root.iterdir()):
        if child.name.startswith(".") or (child.is_file() and child.suffix.lower() != ".gguf"):
            continue
        try:
            source = resolve(child)
        except (CheckpointError, UnsupportedConfigError, OSError):  # not a model (notes, an empty run): not listed
            continue
        if source.kind == ADAPTER:  # adapters are listed against their base (discover_adapters)
            continue
        path = source.path if source.format == GGUF else child  # a folder wrapping one .gguf: that file
        found.append(ModelSpec(child.stem if child.is_file() else child.name, str(path), source=source))
    return found


def _same_path(a: str | Path, b: str | Path) -> bool:
    try:
        return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
    except OSError:
        return False


def adapter_base(adapter_dir: str | Path, models: list[ModelSpec]) -> str | None:
    """The served model a PEFT adapter was trained on: its base_model_name_or_path, matched to a
    model's name or path (None when it names none of them)."""
    try:
        config = json.loads((Path(adapter_dir).expanduser() / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    if not base:
        return None
    for spec in models:
        if spec.base is None and (base == spec.name or _same_path(base, spec.path)):
            return spec.name
    return None


def discover_adapters(models_dir: str | Path, models: list[ModelSpec]) -> list[ModelSpec]:
    """Every PEFT LoRA adapter directly below `models_dir` whose base is one of `models`."""
    found = []
    for child in sorted(Path(models_dir).expanduser().iterdir()):
        if child.is_dir() and not child.name.startswith(".") and (child / "adapter_config.json").is_file():
            base = adapter_base(child, models)
            if base is not None:
                found.append(ModelSpec(child.name, str(child), base=base))
    return found


def estimate_bytes(spec: ModelSpec) -> int:
    """Bytes a model's weights take on disk (of the checkpoint `latest` names, for a run): the memory
    it will need, before it is loaded. 0 when the path names no model."""
    if spec.source is not None:
        return spec.source.size_bytes
    try:
        return resolve(spec.path).size_bytes
    except (CheckpointError, UnsupportedConfigError, OSError):
        return 0
