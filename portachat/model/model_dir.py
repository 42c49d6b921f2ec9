"""Model checkpoints as Hugging Face model directories.

config.json + generation_config.json + model.safetensors + tokenizer files load in
`transformers` with no remote code; portachat.json carries what transformers does not know
(stage, step, metrics, data position, training config). Loading reads safetensors and JSON only:
nothing is unpickled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from portachat.i18n import _
from portachat.model import GPT, GPTConfig
from portachat.model.hf import exportable, from_hf_config, generation_config, own_config_json, to_hf_config
from portachat.storage.atomic import CheckpointError, recover_commit
from portachat.tokenizer import Tokenizer
from portachat.tokenizer.chat_tokenizer import TemplateChatTokenizer

FORMAT_VERSION = 1
WEIGHTS = "model.safetensors"
META = "portachat.json"


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def save_model_files(
    directory: Path,
    model: GPT,
    tokenizer: Tokenizer | TemplateChatTokenizer,
    meta: dict[str, Any],
    generation_defaults: dict[str, Any] | None = None,
    dtype: torch.dtype | None = None,
) -> None:
    """Write the HF model directory contents into `directory` (already created, not yet in place).

    `tokenizer` is ours, or an imported model's TemplateChatTokenizer (a fine-tuned Llama/Qwen keeps
    its tokenizer and chat template); `generation_defaults` (e.g. temperature, top_p) go into
    generation_config.json next to the bos/eos ids. `dtype` stores the weights in that width
    (config.json's torch_dtype says which; `export hf` writes bf16/fp16), else as the model holds them."""
    cfg: GPTConfig = model.config
    weights_dtype = dtype if dtype is not None else model.model.embed_tokens.weight.dtype
    ok, reason = exportable(cfg)
    if ok:
        hf_config = to_hf_config(cfg, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id, dtype=weights_dtype)
    else:  # options outside every HF family: exact for us, refused by transformers by name
        hf_config = own_config_json(cfg, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id)
    state = {k: v.detach().to("cpu", dtype=dtype).contiguous() for k, v in model.state_dict().items()}
    if cfg.tie_embeddings:
        state.pop("lm_head.weight", None)  # transformers re-ties it from embed_tokens
    save_file(state, str(directory / WEIGHTS), metadata={"format": "pt"})
    _write_json(directory / "config.json", hf_config)
    # Every end-of-generation id (a list), so transformers and vLLM stop where portachat does.
    generation = {**(generation_defaults or {}), **generation_config(bos_id=tokenizer.bos_id, eos_id=tokenizer.end_ids)}
    _write_json(directory / "generation_config.json", generation)
    tokenizer.save(directory, model_max_length=cfg.max_seq_len)
    full_meta = dict(meta)
    full_meta.update(
        format_version=FORMAT_VERSION,
        model_config=cfg.to_dict(),
        tokenizer_fingerprint=tokenizer.fingerprint(),
        exportable=ok,
        export_note=reason,
    )
    _write_json(directory / META, full_meta)


@dataclass
class LoadedModel:
    model: GPT
    tokenizer: Tokenizer
    meta: dict[str, Any]
    path: Path


def read_meta(path: Path) -> dict[str, Any]:
    meta_path = Path(path) / META
    if not meta_path.is_file():
        return {}
    try:
        return json.loads(meta_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CheckpointError(_("{path} is not valid JSON ({error}); the checkpoint is damaged").format(
            path=meta_path, error=exc)) from exc


def load_model_dir(path: str | Path, device: torch.device | str = "cpu") -> LoadedModel:
    """Load our checkpoint directory (our tokenizer) for training or resuming.

    Inference over any source (HF directories of other families, GGUF files) is
    `portachat.model.load.load_for_inference`."""
    path = Path(path)
    recover_commit(path)  # a save that crashed between its renames left the previous copy as .old-*
    for name in ("config.json", WEIGHTS, "tokenizer.json"):
        if not (path / name).is_file():
            raise CheckpointError(_("{path} is not a complete model directory: {name} is missing").format(
                path=path, name=name))
    cfg = read_config(path)
    tokenizer = Tokenizer.load(path)
    meta = read_meta(path)
    check_tokenizer_matches(tokenizer, cfg, meta, where=str(path))
    with torch.device("meta"):
        model = GPT(cfg)
    model.to_empty(device=device)
    model.init_weights()  # fills non-persistent buffers (rotary tables); weights are overwritten below
    load_weights_into(model, path)
    return LoadedModel(model=model, tokenizer=tokenizer, meta=meta, path=path)


def read_config(path: Path) -> GPTConfig:
    try:
        return from_hf_config(json.loads((Path(path) / "config.json").read_text(encoding="utf-8")))
    except (OSError, json.JSONDecodeError, KeyError, ValueError) as exc:
        raise CheckpointError(_("{path} is not a usable model config: {error}").format(
            path=Path(path) / "config.json", error=exc)) from exc


def load_weights_into(model: GPT, path: Path) -> None:
    """Copy a checkpoint's safetensors weights into an existing model of the same config."""
    try:
        state = load_file(str(Path(path) / WEIGHTS), device="cpu")
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(_("{path} cannot be read ({error}); the checkpoint is damaged").format(
            path=Path(path) / WEIGHTS, error=exc)) from exc
    if model.config.tie_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if model.config.tie_embeddings:
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise CheckpointError(
            _("{path} does not match its config: missing {missing}, unexpected {unexpected}").format(
                path=Path(path) / WEIGHTS, missing=missing[:5], unexpected=unexpected[:5])
        )


def check_tokenizer_matches(tokenizer: Tokenizer, cfg: GPTConfig, meta: dict[str, Any], where: str) -> None:
    """Refuse a tokenizer whose ids the model cannot embed or that differs from the one it was trained with."""
    if tokenizer.vocab_size > cfg.vocab_size:
        raise CheckpointError(
            _("tokenizer/checkpoint vocab mismatch in {where}: the tokenizer has {n} tokens "
              "but the model embeds only {vocab}. Use the tokenizer saved with this checkpoint.").format(
                where=where, n=tokenizer.vocab_size, vocab=cfg.vocab_size)
        )
    expected = meta.get("tokenizer_fingerprint")
    if expected and expected != tokenizer.fingerprint():
        raise CheckpointError(
            _("tokenizer/checkpoint mismatch in {where}: this checkpoint was trained with tokenizer "
              "{expected}, not {actual}. Use the tokenizer saved with this checkpoint.").format(
                where=where, expected=expected, actual=tokenizer.fingerprint())
        )
