"""The one model resolver: `resolve(spec)` turns whatever names a model into a `ModelSource`.

A spec is a path (a model directory, a .gguf file, a directory holding one .gguf, a stage directory
or a run directory), `run/stage` or `run` under PORTACHAT_HOME, a Hub id already in the Hugging
Face cache, or `hf:org/name` / `modelscope:org/name` (downloaded when missing; see
portachat.storage.hubs). "Latest" always means the stage's `latest` pointer, never a guess from
file times. Resolve once per load and pass the ModelSource down: `latest` may move and a hub
lookup costs a round trip, so every part of one load must see the same answer.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from portachat.i18n import _
from portachat.model.bert import BERT_ARCHITECTURES
from portachat.model.hf import SUPPORTED, UnsupportedConfigError
from portachat.model.hf_dir import read_json
from portachat.storage import hubs
from portachat.storage.atomic import CheckpointError
from portachat.storage.paths import portachat_home
from portachat.storage.runs import latest_checkpoint, run_latest
from portachat.tokenizer.bpe import SPECIAL_TOKENS

# What a model is for (the registry's kinds) ...
CHAT, EMBEDDING, ADAPTER = "chat", "embedding", "adapter"
# ... and how its files are laid out (InferenceModel.source names the same three for loaded models).
PORTACHAT, HUGGINGFACE, GGUF, PEFT = "portachat", "huggingface", "gguf", "peft"

# What a model directory needs from a hub repo (weights, configs, tokenizer, chat template), not the
# other formats many repos also carry (pytorch_model.bin, onnx/, gguf files).
MODEL_FILE_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "tokenizer.model", "*.tiktoken", "merges.txt",
                       "vocab.*"]
# File types whose bytes are the weights: a loaded model takes about as much memory.
_WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt")
_ST_POOLING_MODULE = "sentence_transformers.models.Pooling"


@dataclass(frozen=True)
class ModelSource:
    spec: str  # what the user gave (errors name it)
    path: Path  # the model directory, adapter directory or .gguf file
    kind: str  # CHAT, EMBEDDING or ADAPTER
    format: str  # PORTACHAT (our checkpoint), HUGGINGFACE (an HF directory), GGUF or PEFT (a LoRA adapter)
    size_bytes: int  # the weights on disk: about the memory the model will take

    @property
    def name(self) -> str:
        return display_name(self.path)


def resolve(spec: str | Path | ModelSource) -> ModelSource:
    """The model `spec` names (a ModelSource is returned as it is). Raises CheckpointError naming the
    spec when there is none, UnsupportedConfigError for a file that is not a .gguf."""
    if isinstance(spec, ModelSource):
        return spec
    text = str(spec)
    try:
        path = _model_path(_locate(spec))
    except CheckpointError as exc:
        if text in str(exc):
            raise
        raise CheckpointError(_("{spec}: {error}").format(spec=text, error=exc)) from None
    kind, fmt = _kind(path)
    return ModelSource(text, path, kind, fmt, _weight_bytes(path))


def display_name(path: Path) -> str:
    """A short model name: `run-stage` for our step directories, `org/name` for a Hub cache
    snapshot, the file stem of a .gguf, else the directory name."""
    if path.is_file():
        return path.stem
    if path.name.startswith("step_"):  # <run>/<stage>/step_N: the run and stage say more
        return f"{path.parent.parent.name}-{path.parent.name}"
    repo = path.parent.parent.name
    if path.parent.name == "snapshots" and repo.startswith("models--"):
        return repo.removeprefix("models--").replace("--", "/")
    return path.name


def st_modules(directory: Path) -> list[dict[str, Any]] | None:
    """sentence-transformers' modules.json (None when the directory has none)."""
    file = directory / "modules.json"
    if not file.is_file():
        return None
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(_("{path} is not readable JSON: {error}").format(path=file, error=exc)) from None
    if not isinstance(data, list) or not all(isinstance(m, dict) for m in data):
        raise CheckpointError(_("{path}: expected a list of modules (objects with a 'type')").format(path=file))
    return data


def is_embedding_model(path: str | Path) -> bool:
    """Whether `path` is an embedding model: a sentence-transformers directory (modules.json with a
    Pooling module) or a BERT encoder (which cannot generate text)."""
    directory = Path(path)
    if not directory.is_dir() or not (directory / "config.json").is_file():
        return False
    modules = st_modules(directory) or []
    if any(m.get("type") == _ST_POOLING_MODULE for m in modules):
        return True
    config = read_json(directory / "config.json")
    return config.get("model_type") == "bert" or any(a in BERT_ARCHITECTURES for a in config.get("architectures") or [])


def is_portachat_dir(directory: Path) -> bool:
    """Whether tokenizer.json carries portachat's chat tokens (then our format and tool apply)."""
    try:
        data = read_json(Path(directory) / "tokenizer.json")
    except CheckpointError:
        return False
    added = {t.get("content") for t in data.get("added_tokens") or [] if isinstance(t, dict)}
    return all(t in added for t in SPECIAL_TOKENS)


# ----------------------------------------------------------------------------- steps


def _locate(spec: str | Path) -> Path:
    """The local path `spec` names: as given, under <home>/runs, or a hub's copy."""
    if isinstance(spec, str) and hubs.has_hub_prefix(spec) and not Path(spec).expanduser().exists():
        return _hub_download(spec)
    path = Path(spec).expanduser()
    if path.exists():
        return path
    runs = portachat_home() / "runs" / str(spec)
    if runs.exists():
        return runs
    hub = None
    if not path.is_absolute():
        try:
            on_modelscope = hubs.default_hub() == hubs.MODELSCOPE
        except hubs.HubError as e:
            raise CheckpointError(str(e)) from None
        hub = _hub_download(str(spec)) if on_modelscope else _hub_snapshot(str(spec))  # a bare id
    if hub is None:
        looked = "" if path.is_absolute() else " " + _("(also looked in {runs} and the Hugging Face cache)").format(
            runs=runs)
        raise CheckpointError(
            _("no model at {spec}{looked}: pass a checkpoint directory, a Hugging Face model directory "
              "(config.json + safetensors + tokenizer.json) or a .gguf file; or hf:OWNER/NAME or "
              "modelscope:OWNER/NAME to download one").format(spec=spec, looked=looked)
        )
    return hub


def _model_path(path: Path) -> Path:
    """The model inside a located path: a stage directory's `latest`, a run's furthest stage, one .gguf."""
    if path.is_file() and path.name == "latest":  # a stage's pointer file, as `<run>/<stage>/latest` reads
        return latest_checkpoint(path.parent) or path
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise UnsupportedConfigError(
                _("{path} is a file but not a .gguf; pass a model directory or a .gguf file ({families} families)")
                .format(path=path, families=SUPPORTED)
            )
        return path
    if (path / "config.json").is_file() or (path / "adapter_config.json").is_file():
        return path
    latest = latest_checkpoint(path) or run_latest(path)
    if latest is not None:
        return latest
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return ggufs[0]
    raise CheckpointError(
        (_("{path} is not a model directory: config.json is missing and it holds {n} .gguf files; pass one of them")
         if ggufs else _("{path} is not a model directory: config.json is missing and it has no `latest` checkpoint"))
        .format(path=path, n=len(ggufs))
    )


def _kind(path: Path) -> tuple[str, str]:
    if path.is_file():
        return CHAT, GGUF
    if not (path / "config.json").is_file():
        return ADAPTER, PEFT
    if is_embedding_model(path):
        return EMBEDDING, HUGGINGFACE
    return CHAT, PORTACHAT if is_portachat_dir(path) else HUGGINGFACE


def _weight_bytes(path: Path) -> int:
    """Bytes of the weights the model loads (safetensors where there are any: a .bin beside them is a copy)."""
    if path.is_file():
        return path.stat().st_size
    files = [f for f in path.iterdir() if f.is_file() and f.suffix in _WEIGHT_SUFFIXES]
    if not files:  # e.g. a sentence-transformers package with its weights one folder down
        files = [f for f in path.rglob("*") if f.is_file() and f.suffix in _WEIGHT_SUFFIXES]
    if any(f.suffix == ".safetensors" for f in files):
        files = [f for f in files if f.suffix == ".safetensors"]
    return sum(f.stat().st_size for f in files)


# ----------------------------------------------------------------------------- hubs


def _hub_snapshot(repo_id: str) -> Path | None:
    """The local snapshot of a Hugging Face Hub model already in the HF cache (never downloads)."""
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo_id):
        return None
    try:
        from huggingface_hub import snapshot_download  # deferred: slow import, downloads only

        return Path(snapshot_download(repo_id=repo_id, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached, no huggingface_hub, bad name: all mean "not here"
        return None


def _hub_download(spec: str) -> Path:
    """`hf:OWNER/NAME` or `modelscope:OWNER/NAME` (a bare id when PORTACHAT_HUB=modelscope): the model's
    files in that hub's cache, downloaded when missing and a network is there (HF_HUB_OFFLINE=1: the
    cache only). HF_ENDPOINT / MODELSCOPE_DOMAIN choose the server."""
    try:
        ref = hubs.parse_repo(spec)
    except hubs.HubError as e:
        raise CheckpointError(str(e)) from None
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", ref.repo_id):
        raise CheckpointError(_("{spec}: expected a hub model id OWNER/NAME (e.g. hf:Qwen/Qwen3-0.6B)").format(spec=spec))
    try:
        return hubs.snapshot(ref, repo_type="model", allow_patterns=MODEL_FILE_PATTERNS)
    except hubs.HubError as e:
        raise CheckpointError(_("{spec}: {error}").format(spec=spec, error=e)) from None
    except Exception as e:  # offline and not cached, no access, a typo in the id
        offline = _(" (HF_HUB_OFFLINE is set and it is not in the cache)") if hubs.is_offline() else ""
        raise CheckpointError(
            _("cannot get model {ref}{offline}: {type}: {error}. Check the id, or download the model "
              "elsewhere and pass its directory").format(ref=ref, offline=offline, type=type(e).__name__, error=e)
        ) from None
