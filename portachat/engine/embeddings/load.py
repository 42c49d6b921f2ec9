"""Building an Embedder: from an embedding model directory (a BERT encoder, or a decoder with
sentence-transformers pooling files) or over a chat model that is already loaded."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from tokenizers import Tokenizer as HFTokenizer

from portachat.device import Device, get_device
from portachat.engine.embeddings.config import DEFAULT_POOLING, PoolingConfig, read_pooling_config
from portachat.engine.embeddings.embedder import Embedder, Hidden
from portachat.i18n import _
from portachat.model.bert import build_bert
from portachat.model.gpt import GPT
from portachat.model.hf import from_hf_config
from portachat.model.hf_dir import read_json, read_tokenizer_files, read_weights
from portachat.model.load import build_model
from portachat.model.source import display_name
from portachat.ops.inference_dtype import inference_dtype
from portachat.quant.apply import model_dtype
from portachat.storage.atomic import CheckpointError
from portachat.tokenizer.protocol import ChatTokenizer


def special_affixes(tokenizer: HFTokenizer) -> tuple[list[int], list[int]]:
    """The special ids the tokenizer's post-processor puts before and after one text (BERT: [CLS], [SEP]),
    found by encoding a word with and without them, so token-id inputs get the same wrapping as text."""
    bare = tokenizer.encode("hello", add_special_tokens=False).ids
    full = tokenizer.encode("hello", add_special_tokens=True).ids
    for start in range(len(full) - len(bare) + 1):
        if full[start: start + len(bare)] == bare:
            return full[:start], full[start + len(bare):]
    raise CheckpointError(_("the tokenizer's special tokens could not be located around a text"))


def _size(model: torch.nn.Module) -> str:
    params = sum(p.numel() for p in model.parameters())
    return f"{params / 1e9:.2f}B" if params >= 1e9 else f"{params / 1e6:.1f}M"


def _describe(name: str, kind: str, model: torch.nn.Module, embedder: Embedder, dtype: torch.dtype) -> str:
    p = embedder.pooling
    pooling = (_("{pooling} pooling, normalized") if p.normalize else _("{pooling} pooling")).format(pooling=p.pooling)
    return _("{name}: {kind}, {size} parameters, {dimensions} dimensions, {pooling} ({source}), at most {tokens} "
             "tokens, {dtype}").format(name=name, kind=kind, size=_size(model), dimensions=embedder.dimension,
                                       pooling=pooling, source=p.source, tokens=embedder.max_tokens,
                                       dtype=str(dtype).removeprefix("torch."))


def load_embedding_model(path: str | Path, device: Device | None = None, dtype: str | torch.dtype | None = None,
                         pooling: str | None = None) -> Embedder:
    """An Embedder for an embedding model directory: a BERT encoder run by portachat.model.bert, or a
    decoder family our GPT runs, pooled as its sentence-transformers files say (`pooling` overrides);
    inputs are wrapped in the special tokens its tokenizer's post-processor adds.
    `dtype` defaults to the device layer's inference dtype."""

    directory = Path(path)
    device = device or get_device()
    if isinstance(dtype, torch.dtype):
        chosen = dtype
    else:
        chosen = inference_dtype(device, dtype).value
    config = read_json(directory / "config.json")
    pooling_cfg = read_pooling_config(directory).with_pooling(pooling)
    tokenizer, _ = read_tokenizer_files(directory)
    tokenizer.no_truncation()  # tokenizer.json may carry a fixed length; limits are ours to enforce
    tokenizer.no_padding()
    prefix, suffix = special_affixes(tokenizer)  # e.g. [CLS] ... [SEP], or a decoder's trailing EOS
    model: torch.nn.Module
    if config.get("model_type") == "bert":
        model = bert = build_bert(config, read_weights(directory), device.torch_device, chosen, where=str(directory))
        hidden: Hidden = bert
        kind, dimension, positions = "BERT encoder", bert.config.hidden_size, bert.config.max_position_embeddings
        vocab, pad_id = bert.config.vocab_size, bert.config.pad_token_id
    else:  # a decoder family our GPT runs (e.g. Qwen3 embedding models)
        model = gpt = _decoder_from_dir(directory, config, device.torch_device, chosen)
        hidden = _decoder_hidden(gpt)
        kind, dimension, positions = f"{gpt.config.architecture} decoder", gpt.config.n_embd, gpt.config.max_seq_len
        vocab, pad_id = gpt.config.vocab_size, 0
    embedder = Embedder(
        hidden=hidden,
        encode=lambda text: tokenizer.encode(text, add_special_tokens=False).ids,
        pooling=pooling_cfg,
        dimension=dimension,
        max_tokens=min(pooling_cfg.max_tokens or positions, positions),
        vocab_size=vocab,
        device=device.torch_device,
        prefix=prefix,
        suffix=suffix,
        pad_id=pad_id,
        module=model,
    )
    embedder.description = _describe(display_name(directory), kind, model, embedder, chosen)
    return embedder


class _Prefixed(Mapping[str, torch.Tensor]):
    """A base model's weights (Qwen3Model: `layers.0...`) under the causal LM's names (`model.layers.0...`),
    still read lazily."""

    def __init__(self, weights: Mapping[str, torch.Tensor], prefix: str) -> None:
        self.weights, self.prefix = weights, prefix

    def shape(self, name: str) -> tuple[int, ...]:
        inner = getattr(self.weights, "shape", None)
        key = name.removeprefix(self.prefix)
        return tuple(inner(key)) if inner is not None else tuple(self.weights[key].shape)

    def __getitem__(self, name: str) -> torch.Tensor:
        if not name.startswith(self.prefix):
            raise KeyError(name)
        return self.weights[name.removeprefix(self.prefix)]

    def __iter__(self) -> Iterator[str]:
        return (self.prefix + k for k in self.weights)

    def __len__(self) -> int:
        return len(self.weights)


def _decoder_from_dir(directory: Path, config: dict, device: torch.device, dtype: torch.dtype) -> GPT:
    """Our GPT from an embedding model's decoder: a causal LM's weights, or a base model's (no `model.`
    prefix, no output head: the head is tied to the embeddings, since embeddings never read it)."""
    weights = read_weights(directory)
    if not any(k.startswith("model.") for k in weights):
        weights = _Prefixed(weights, "model.")
        config = {**config, "tie_word_embeddings": True}
    cfg = from_hf_config({**config, "architectures": []})  # Qwen3Model and Qwen3ForCausalLM alike
    return build_model(cfg, weights, device, dtype, where=str(directory))


def _decoder_hidden(model: GPT) -> Hidden:
    # Right padding under causal attention: no real token ever attends to a pad, so no mask is needed.
    return lambda ids, mask: model.hidden_states(ids)


def decoder_embedder(model: GPT, tokenizer: ChatTokenizer, pooling: PoolingConfig | None = None, bos: bool = False,
                     max_tokens: int | None = None, name: str = "model") -> Embedder:
    """An Embedder over a decoder's final hidden states (after the last norm). Inputs are right-padded,
    and causal attention keeps padding out of every real token's state. `bos`: put the BOS token first
    (our models were trained on BOS-led documents)."""
    pooling = pooling or DEFAULT_POOLING

    # Not embed_tokens.weight: a quantized embedding has none.
    device = next(t for t in (*model.parameters(), *model.buffers())).device
    dtype = model_dtype(model)
    prefix = [tokenizer.bos_id] if bos and tokenizer.bos_id is not None else []
    limit = min(max_tokens or model.config.max_seq_len, pooling.max_tokens or model.config.max_seq_len)
    embedder = Embedder(
        hidden=_decoder_hidden(model),
        encode=tokenizer.encode,
        pooling=pooling,
        dimension=model.config.n_embd,
        max_tokens=limit,
        vocab_size=tokenizer.vocab_size,
        device=device,
        prefix=prefix,
        module=model,
    )
    embedder.description = _describe(name, f"{model.config.architecture} decoder", model, embedder, dtype)
    return embedder
