"""One entry point for inference: `load_for_inference(path)` takes our checkpoint directory, a
Hugging Face directory (Llama / SmolLM2, Qwen2, Qwen3) or a `.gguf` file and returns the model
(eval mode, on the device, in the dtype), a ChatTokenizer and the model's generation defaults.

Every source becomes the same `ModelParts` (config dict, HF-named state dict, tokenizer, its
config, generation config) and `build_from_parts` turns parts into a model, so a GGUF and an HF
directory of the same model load identically.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from portachat.device import Device, get_device
from portachat.device.dtypes import parse_dtype
from portachat.i18n import _
from portachat.model.config import GPTConfig
from portachat.model.gguf import read_gguf
from portachat.model.gpt import GPT
from portachat.model.hf import from_hf_config
from portachat.model.hf_dir import ModelParts, read_hf_dir, read_json
from portachat.model.lora import find_adapter_dir, load_lora, merge_into
from portachat.model.model_dir import check_tokenizer_matches, read_meta
from portachat.model.source import GGUF, PEFT, PORTACHAT, ModelSource, display_name, resolve
from portachat.ops.inference_dtype import inference_dtype
from portachat.storage.atomic import CheckpointError
from portachat.tokenizer.bpe import Tokenizer
from portachat.tokenizer.chat_tokenizer import PortachatChatTokenizer, TemplateChatTokenizer
from portachat.tokenizer.protocol import ChatTokenizer

# Rotary tables are built for at most this many positions up front and grow on demand: a model
# whose config allows 128k positions should not hold 128k-row tables before anyone needs them.
ROTARY_PREALLOC = 4096
_IGNORED_KEYS = ("rotary_emb.inv_freq",)  # derived buffers some old checkpoints saved


@dataclass(frozen=True)
class GenerationDefaults:
    """The model authors' sampling settings from generation_config.json; None = not set.
    `do_sample=False` means they chose greedy decoding (transformers' default when unset)."""

    do_sample: bool | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    max_new_tokens: int | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GenerationDefaults:
        def number(key: str, kind: type) -> Any:
            value = d.get(key)
            return kind(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

        do_sample = d.get("do_sample")
        return cls(
            do_sample=do_sample if isinstance(do_sample, bool) else None,
            temperature=number("temperature", float),
            top_k=number("top_k", int),
            top_p=number("top_p", float),
            repetition_penalty=number("repetition_penalty", float),
            max_new_tokens=number("max_new_tokens", int),
        )


@dataclass
class InferenceModel:
    model: GPT  # eval mode, on `device`, weights in `dtype`
    tokenizer: ChatTokenizer
    generation: GenerationDefaults
    name: str  # short id (directory or file name), e.g. for /v1/models
    description: str  # one line for logs: family, size, dtype, source
    source: str  # "portachat", "huggingface" or "gguf"
    path: Path
    device: torch.device
    dtype: torch.dtype
    # Whether a plain-text (completion) prompt starts with BOS, as the tokenizer files tell every
    # other runtime: always for our checkpoints, else what the tokenizer's post-processor adds.
    bos_for_completions: bool = False

    @property
    def max_seq_len(self) -> int:
        return self.model.config.max_seq_len


# ----------------------------------------------------------------------------- parts -> model


def _eos_ids(*values: Any) -> list[int]:
    """eos ids from the first source that has them (an int or a list of ints)."""
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool):
            return [value]
        if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
            return list(value)
    return []


def _shape(state: Mapping[str, torch.Tensor], name: str) -> tuple[int, ...]:
    shape = getattr(state, "shape", None)  # SafetensorsWeights: from the header, without reading the tensor
    return tuple(shape(name)) if shape is not None else tuple(state[name].shape)


def check_state_dict(cfg: GPTConfig, state: Mapping[str, torch.Tensor], where: str) -> list[str]:
    """The names our GPT(cfg) loads from `state` (derived buffers and a tied lm_head left out),
    after checking every name and shape, so a mismatch is one clear error instead of a
    half-loaded model."""
    names = {k for k in state if not k.endswith(_IGNORED_KEYS)}
    if cfg.tie_embeddings:
        names.discard("lm_head.weight")  # transformers ties it to embed_tokens, ignoring a stored copy
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in GPT(cfg).state_dict().items()}
    if cfg.tie_embeddings:
        expected.pop("lm_head.weight")
    missing = sorted(set(expected) - names)
    unexpected = sorted(names - set(expected))
    if missing or unexpected:
        hint = ""
        if missing == ["lm_head.weight"]:
            hint = _(" (config.json says tie_word_embeddings=false but the weights have no lm_head)")
        raise CheckpointError(
            _("{where}: the weights do not match config.json: missing {missing}, unexpected {unexpected}{hint}").format(
                where=where, missing=missing[:5], unexpected=unexpected[:5], hint=hint)
        )
    wrong = [f"{k}: {_shape(state, k)} != {s}" for k, s in expected.items() if _shape(state, k) != s]
    if wrong:
        raise CheckpointError(_("{where}: tensor shapes do not match config.json: {wrong}").format(
            where=where, wrong=wrong[:3]))
    return sorted(expected)


def build_model(
    cfg: GPTConfig,
    state_dict: Mapping[str, torch.Tensor],
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    where: str = "model",
) -> GPT:
    """Our GPT for `cfg` holding `state_dict` (HF names), in eval mode on `device` in `dtype`.
    Tensors are read and converted one at a time, so a lazily read checkpoint never needs a
    second full copy of the weights in host memory."""
    names = check_state_dict(cfg, state_dict, where)
    with torch.device("meta"):
        model = GPT(cfg)
    state = {name: state_dict[name].to(device=device, dtype=dtype) for name in names}
    model.load_state_dict(state, strict=False, assign=True)
    if cfg.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model._set_rotary(min(cfg.max_seq_len, ROTARY_PREALLOC), torch.device(device))
    model.requires_grad_(False)
    return model.eval()


def build_from_parts(
    parts: ModelParts | Any,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    where: str = "model",
) -> tuple[GPT, ChatTokenizer, GenerationDefaults]:
    """Model, chat tokenizer and generation defaults from in-memory parts (an HF directory's or a
    GGUF's: anything with ModelParts' fields). The chat tokenizer is the template one."""
    cfg = from_hf_config(parts.config)
    model = build_model(cfg, parts.state_dict, device, dtype, where)
    eos = _eos_ids(parts.generation_config.get("eos_token_id"), parts.config.get("eos_token_id"))
    tokenizer = TemplateChatTokenizer(parts.tokenizer, parts.tokenizer_config, eos_ids=eos)
    if tokenizer.vocab_size > cfg.vocab_size:
        raise CheckpointError(
            _("{where}: the tokenizer has {tokens} tokens but the model embeds only {vocab}").format(
                where=where, tokens=tokenizer.vocab_size, vocab=cfg.vocab_size)
        )
    return model, tokenizer, GenerationDefaults.from_dict(parts.generation_config)


# ----------------------------------------------------------------------------- dispatch


def _describe(cfg: GPTConfig, model: GPT, dtype: torch.dtype, source: str, path: Path) -> str:
    params = model.num_params()
    size = f"{params / 1e9:.2f}B" if params >= 1e9 else f"{params / 1e6:.1f}M"
    scaling = _(", rope {kind}").format(kind=cfg.rope_scaling["rope_type"]) if cfg.rope_scaling else ""
    return _("{name}: {architecture} family, {size} parameters, {layers} layers{scaling}, {dtype}, from {source} "
             "({path})").format(name=path.name, architecture=cfg.architecture, size=size, layers=cfg.n_layer,
                                scaling=scaling, dtype=str(dtype).removeprefix("torch."), source=source, path=path)


def _resolve_device(device: Device | torch.device | str | None, dtype: torch.dtype | str | None
                    ) -> tuple[torch.device, torch.dtype]:  # fmt: skip
    dev = get_device() if device is None else device if isinstance(device, Device) else None
    torch_device = dev.torch_device if dev is not None else torch.device(device)
    if isinstance(dtype, str):
        dtype = parse_dtype(dtype)
    if dtype is None:  # the device layer's choice (on a CPU: measured once, bf16 only where it is faster)
        dtype = inference_dtype(dev or get_device(torch_device.type)).value
    return torch_device, dtype


def load_for_inference(
    path: str | Path | ModelSource,
    device: Device | torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
    lora: str | Path | None = None,
) -> InferenceModel:
    """Load a model for inference from our checkpoint directory, a Hugging Face model directory
    (Llama / SmolLM2, Qwen2, Qwen3) or a .gguf file: any spec `resolve` accepts, or its ModelSource.

    `device` defaults to `get_device()`; `dtype` (torch dtype or "fp32"/"bf16"/"fp16") to the device
    layer's inference dtype. `lora` is a PEFT LoRA adapter directory trained on this model: it is
    folded into the weights at load time (merged in fp32, then cast), so serving it costs nothing extra.
    Unsupported architectures raise UnsupportedConfigError naming the supported ones; missing or
    damaged files raise CheckpointError saying which file.
    """
    source = resolve(path)
    if lora is not None:
        return _with_adapter(source, device, dtype, _adapter_dir(lora))
    path = source.path
    if source.format == PEFT:  # a LoRA run's checkpoint: base + adapter
        return _with_adapter(_adapter_base(path), device, dtype, path)
    torch_device, dtype = _resolve_device(device, dtype)
    if source.format == GGUF:
        return _load_gguf(path, torch_device, dtype)
    from_hf_config(read_json(path / "config.json"))  # an unsupported family fails before any weight is read
    parts = read_hf_dir(path)
    if source.format == PORTACHAT:
        return _load_ours(path, parts, torch_device, dtype)
    model, tokenizer, generation = build_from_parts(parts, torch_device, dtype, where=str(path))
    return InferenceModel(
        model=model,
        tokenizer=tokenizer,
        generation=generation,
        name=display_name(path),
        description=_describe(model.config, model, dtype, "huggingface", path),
        source="huggingface",
        path=path,
        device=torch_device,
        dtype=dtype,
        bos_for_completions=tokenizer.adds_bos,
    )


def _load_ours(path: Path, parts: ModelParts, device: torch.device, dtype: torch.dtype) -> InferenceModel:
    cfg = from_hf_config(parts.config)
    tokenizer = Tokenizer(parts.tokenizer)
    meta = read_meta(path)
    check_tokenizer_matches(tokenizer, cfg, meta, where=str(path))
    model = build_model(cfg, parts.state_dict, device, dtype, where=str(path))
    return InferenceModel(
        model=model,
        tokenizer=PortachatChatTokenizer(tokenizer),
        generation=GenerationDefaults.from_dict(parts.generation_config),
        name=display_name(path),
        description=_describe(cfg, model, dtype, "portachat checkpoint", path),
        source="portachat",
        path=path,
        device=device,
        dtype=dtype,
        bos_for_completions=True,
    )


def _load_gguf(path: Path, device: torch.device, dtype: torch.dtype) -> InferenceModel:
    parts = read_gguf(path)
    model, tokenizer, generation = build_from_parts(parts, device, dtype, where=str(path))
    return InferenceModel(
        model=model,
        tokenizer=tokenizer,
        generation=generation,
        name=display_name(path),
        description=_describe(model.config, model, dtype, "gguf", path),
        source="gguf",
        path=path,
        device=device,
        dtype=dtype,
        bos_for_completions=tokenizer.adds_bos,
    )


def _with_adapter(path: str | Path | ModelSource, device: Device | torch.device | str | None, dtype: torch.dtype | str | None,
                  adapter: Path) -> InferenceModel:
    torch_device, dtype = _resolve_device(device, dtype)
    lora = load_lora(adapter)  # a damaged adapter fails before the base model is read
    loaded = load_for_inference(path, device=torch_device, dtype=torch.float32)
    model = merge_into(loaded.model, lora)
    model.requires_grad_(False)
    for p in model.parameters():  # weights only: the rotary tables stay fp32
        p.data = p.data.to(dtype)
    loaded.model, loaded.dtype = model.eval(), dtype
    loaded.name = f"{loaded.name}+{adapter.name}"
    loaded.description = loaded.description.replace("float32", str(dtype).removeprefix("torch.")) + f" + LoRA {adapter}"
    return loaded


def _adapter_dir(spec: str | Path) -> Path:
    return find_adapter_dir(spec)


def _adapter_base(adapter: Path) -> str:
    """The base model a LoRA adapter directory names (peft's base_model_name_or_path)."""
    base = read_json(adapter / "adapter_config.json").get("base_model_name_or_path")
    if not base:
        raise CheckpointError(_("{adapter} is a LoRA adapter that does not name its base model: pass --model BASE "
                                "--lora {adapter}").format(adapter=adapter))
    return str(base)
