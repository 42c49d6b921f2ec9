"""Read a Hugging Face model directory into memory as `ModelParts`: the same parts a GGUF file
gives (portachat.model.gguf.GGUFParts has these fields), so one builder serves both.

Weights come from `model.safetensors`, a sharded `model.safetensors.index.json`, or (older
checkpoints) `pytorch_model.bin`, which is read with `torch.load(weights_only=True)`: tensors
only, nothing unpickled that could run code.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from tokenizers import Tokenizer as HFTokenizer

from portachat.i18n import _
from portachat.storage.atomic import CheckpointError

SAFETENSORS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
TORCH_BIN, TORCH_BIN_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # newer transformers write the template here


@dataclass
class ModelParts:
    """A model as plain data: config.json's dict, a state dict with HF names, the tokenizer and the
    dicts of tokenizer_config.json and generation_config.json."""

    config: dict[str, Any]
    state_dict: Mapping[str, torch.Tensor]  # a dict, or SafetensorsWeights that reads tensors on access
    tokenizer: HFTokenizer
    tokenizer_config: dict[str, Any]
    generation_config: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)


def read_json(path: Path, required: bool = True) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise CheckpointError(_("{directory} is not a complete model directory: {file} is missing").format(
                directory=path.parent, file=path.name))
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(_("{path} is not valid JSON ({error}); the model directory is damaged").format(
            path=path, error=exc)) from exc
    if not isinstance(data, dict):
        raise CheckpointError(_("{path} must hold a JSON object, got {type}").format(path=path, type=type(data).__name__))
    return data


class SafetensorsWeights(Mapping[str, torch.Tensor]):
    """The tensors of one or more safetensors files, read one at a time when asked for, so a
    loader converting them to another dtype or device never holds a second full copy."""

    def __init__(self, files: list[Path]) -> None:
        self._handles: dict[Path, Any] = {}
        self._file_of: dict[str, Path] = {}
        for file in files:
            try:
                handle = safe_open(str(file), framework="pt", device="cpu")
            except (SafetensorError, OSError) as exc:
                raise CheckpointError(_("{file} cannot be read ({error}); the checkpoint is damaged or incomplete").format(
                    file=file, error=exc)) from exc
            self._handles[file] = handle
            for name in handle.keys():
                self._file_of[name] = file

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handles[self._file_of[name]].get_slice(name).get_shape())

    def __getitem__(self, name: str) -> torch.Tensor:
        file = self._file_of[name]
        try:
            return self._handles[file].get_tensor(name)
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(_("{file}: tensor {name} cannot be read ({error}); the checkpoint is damaged").format(
                file=file, name=name, error=exc)) from exc

    def __iter__(self) -> Iterator[str]:
        return iter(self._file_of)

    def __len__(self) -> int:
        return len(self._file_of)


def _torch_bin(path: Path) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # noqa: BLE001 - weights_only raises UnpicklingError for anything not a tensor
        raise CheckpointError(_(
            "{path} cannot be read as plain tensors ({error}). portachat never unpickles code; convert the model "
            "to safetensors (e.g. transformers' save_pretrained(..., safe_serialization=True))").format(
            path=path, error=exc)) from exc
    if not isinstance(state, dict):
        raise CheckpointError(_("{path} does not hold a state dict").format(path=path))
    return state


def _shards(directory: Path, index_name: str) -> tuple[dict[str, str], list[Path]]:
    weight_map = read_json(directory / index_name).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(_("{path} has no weight_map; the checkpoint is damaged").format(path=directory / index_name))
    files = [directory / shard for shard in sorted(set(weight_map.values()))]
    for file in files:
        if not file.is_file():
            raise CheckpointError(_("{directory} is incomplete: shard {shard} named in {index} is missing").format(
                directory=directory, shard=file.name, index=index_name))
    return weight_map, files


def _check_index(directory: Path, index_name: str, weight_map: dict[str, str], state: Mapping[str, Any]) -> None:
    missing = sorted(set(weight_map) - set(state))
    if missing:
        raise CheckpointError(_("{directory}: tensors {tensors} listed in {index} are not in their shards").format(
            directory=directory, tensors=missing[:5], index=index_name))


def read_weights(directory: str | Path) -> Mapping[str, torch.Tensor]:
    """The state dict of an HF model directory (HF parameter names, stored dtypes, on the CPU);
    safetensors are read lazily, tensor by tensor, as they are looked up."""
    directory = Path(directory)
    if (directory / SAFETENSORS).is_file():
        return SafetensorsWeights([directory / SAFETENSORS])
    if (directory / SAFETENSORS_INDEX).is_file():
        weight_map, files = _shards(directory, SAFETENSORS_INDEX)
        weights = SafetensorsWeights(files)
        _check_index(directory, SAFETENSORS_INDEX, weight_map, weights)
        return weights
    if (directory / TORCH_BIN).is_file() or (directory / TORCH_BIN_INDEX).is_file():
        print(
            "[portachat] " + _("{directory} has no safetensors weights; reading pytorch_model.bin with "
                               "torch.load(weights_only=True) (tensors only, no code is unpickled)").format(
                directory=directory),
            file=sys.stderr,
            flush=True,
        )
        if (directory / TORCH_BIN).is_file():
            return _torch_bin(directory / TORCH_BIN)
        weight_map, files = _shards(directory, TORCH_BIN_INDEX)
        state: dict[str, torch.Tensor] = {}
        for file in files:
            state.update(_torch_bin(file))
        _check_index(directory, TORCH_BIN_INDEX, weight_map, state)
        return state
    raise CheckpointError(_("{directory} has no weights: expected {safetensors}, {index} (sharded) or {bin}").format(
        directory=directory, safetensors=SAFETENSORS, index=SAFETENSORS_INDEX, bin=TORCH_BIN))


def read_tokenizer_files(directory: str | Path) -> tuple[HFTokenizer, dict[str, Any]]:
    """tokenizer.json as a `tokenizers.Tokenizer` and tokenizer_config.json's dict, with the chat
    template from chat_template.jinja when that file exists (it wins, as in transformers)."""
    directory = Path(directory)
    file = directory / "tokenizer.json"
    if not file.is_file():
        raise CheckpointError(_(
            "{directory} has no tokenizer.json; portachat reads fast-tokenizer files only (save the tokenizer "
            "with transformers' AutoTokenizer.save_pretrained to create one)").format(directory=directory))
    try:
        tokenizer = HFTokenizer.from_file(str(file))
    except Exception as exc:  # the Rust side raises a bare Exception on bad JSON
        raise CheckpointError(_("{file} is not a valid tokenizers JSON file: {error}").format(file=file, error=exc)) from exc
    tokenizer_config = read_json(directory / "tokenizer_config.json", required=False)
    template_file = directory / CHAT_TEMPLATE_FILE
    if template_file.is_file():
        tokenizer_config["chat_template"] = template_file.read_text(encoding="utf-8")
    return tokenizer, tokenizer_config


def read_hf_dir(directory: str | Path) -> ModelParts:
    """All parts of an HF model directory, read into memory (config.json is required)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(_("no model directory at {directory}").format(directory=directory))
    config = read_json(directory / "config.json")
    tokenizer, tokenizer_config = read_tokenizer_files(directory)
    return ModelParts(
        config=config,
        state_dict=read_weights(directory),
        tokenizer=tokenizer,
        tokenizer_config=tokenizer_config,
        generation_config=read_json(directory / "generation_config.json", required=False),
    )
