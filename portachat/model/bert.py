"""A BERT encoder laid out like Hugging Face's BertModel (names included), for embedding models.

Sentence-transformers models such as all-MiniLM-L6-v2 are a BertModel plus pooling: this module is
the encoder, so serving them needs neither transformers nor a pickle. Weights come from
safetensors with HF's names (`embeddings.*`, `encoder.layer.N.*`; a `bert.` prefix is dropped),
attention goes through the device layer's `attention()`, and padding is a boolean key mask.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from portachat.i18n import _
from portachat.ops.attention import attention
from portachat.storage.atomic import CheckpointError

# transformers' ACT2FN names for the activations BERT-family configs use.
_ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}
BERT_ARCHITECTURES = ("BertModel", "BertForMaskedLM", "BertForPreTraining")
_IGNORED = ("embeddings.position_ids", "pooler.")  # a derived buffer; the pooler is not used for embeddings


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    pad_token_id: int = 0

    @classmethod
    def from_hf(cls, config: Mapping[str, Any], where: str = "config.json") -> BertConfig:
        """config.json's dict -> BertConfig; a clear error for what this encoder does not implement."""
        if config.get("model_type") != "bert":
            raise CheckpointError(_("{where}: model_type {model_type} is not a BERT encoder "
                                    "(supported: model_type 'bert', architectures {supported})").format(
                where=where, model_type=repr(config.get("model_type")), supported=", ".join(BERT_ARCHITECTURES)))
        position = config.get("position_embedding_type", "absolute")
        if position != "absolute":
            raise CheckpointError(_("{where}: position_embedding_type {value} is not supported (only 'absolute')").format(
                where=where, value=repr(position)))
        act = config.get("hidden_act", "gelu")
        if act not in _ACTIVATIONS:
            raise CheckpointError(_("{where}: hidden_act {value} is not supported ({supported})").format(
                where=where, value=repr(act), supported=", ".join(_ACTIVATIONS)))
        try:
            cfg = cls(**{k: config[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                                  "intermediate_size", "max_position_embeddings")},
                      type_vocab_size=config.get("type_vocab_size", 2),
                      layer_norm_eps=config.get("layer_norm_eps", 1e-12), hidden_act=act,
                      pad_token_id=config.get("pad_token_id") or 0)
        except KeyError as exc:
            raise CheckpointError(_("{where}: missing {key}").format(where=where, key=repr(exc.args[0]))) from None
        if cfg.hidden_size % cfg.num_attention_heads:
            raise CheckpointError(_("{where}: hidden_size {hidden_size} is not a multiple of "
                                    "num_attention_heads {heads}").format(
                where=where, hidden_size=cfg.hidden_size, heads=cfg.num_attention_heads))
        return cfg


class _Dense(nn.Module):
    """HF's `output` blocks: dense, then LayerNorm over the residual sum."""

    def __init__(self, n_in: int, n_out: int, eps: float) -> None:
        super().__init__()
        self.dense = nn.Linear(n_in, n_out)
        self.LayerNorm = nn.LayerNorm(n_out, eps=eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class _SelfAttention(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.n_head = cfg.num_attention_heads
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)

        y = attention(heads(self.query(x)), heads(self.key(x)), heads(self.value(x)), is_causal=False, attn_mask=mask)
        return y.transpose(1, 2).reshape(B, T, C)


class _Attention(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.self = _SelfAttention(cfg)  # HF's name (reads oddly, keeps the checkpoint keys)
        self.output = _Dense(cfg.hidden_size, cfg.hidden_size, cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(x, mask), x)


class _Intermediate(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.act = _ACTIVATIONS[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


class _Layer(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.attention = _Attention(cfg)
        self.intermediate = _Intermediate(cfg)
        self.output = _Dense(cfg.intermediate_size, cfg.hidden_size, cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.attention(x, mask)
        return self.output(self.intermediate(x), x)


class _Embeddings(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        T = ids.size(1)
        positions = torch.arange(T, device=ids.device)
        # One segment (type 0) per input: embeddings embed single texts, not sentence pairs.
        x = self.word_embeddings(ids) + self.position_embeddings(positions)[None] + self.token_type_embeddings.weight[0]
        return self.LayerNorm(x)


class _Encoder(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(_Layer(cfg) for _ in range(cfg.num_hidden_layers))


class BertEncoder(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embeddings = _Embeddings(cfg)
        self.encoder = _Encoder(cfg)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Last hidden states [B, T, hidden] for token ids [B, T]; `attention_mask` [B, T] is 1 on real
        tokens and 0 on padding (padding keys are never attended to)."""
        if ids.size(1) > self.config.max_position_embeddings:
            raise ValueError(_("{tokens} tokens exceed this encoder's {positions} positions").format(
                tokens=ids.size(1), positions=self.config.max_position_embeddings))
        mask = attention_mask.bool()[:, None, None, :]  # [B, 1, 1, T]: every query sees the real keys
        x = self.embeddings(ids)
        for layer in self.encoder.layer:
            x = layer(x, mask)
        return x


def build_bert(config: Mapping[str, Any], state_dict: Mapping[str, torch.Tensor], device: torch.device | str = "cpu",
               dtype: torch.dtype = torch.float32, where: str = "model") -> BertEncoder:
    """A BertEncoder holding `state_dict` (HF names), eval mode, on `device` in `dtype`; every name and
    shape is checked first, so a mismatch is one clear error instead of a half-loaded model."""
    cfg = BertConfig.from_hf(config, where=f"{where}/config.json")
    with torch.device("meta"):
        model = BertEncoder(cfg)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    names = {k.removeprefix("bert."): k for k in state_dict}
    names = {k: v for k, v in names.items() if not k.startswith(_IGNORED)}
    missing = sorted(set(expected) - set(names))
    unexpected = sorted(k for k in set(names) - set(expected) if not k.startswith("cls."))  # MLM head: unused
    if missing or unexpected:
        raise CheckpointError(_("{where}: the weights do not match a BERT encoder: missing {missing}, "
                                "unexpected {unexpected}").format(
            where=where, missing=missing[:5], unexpected=unexpected[:5]))
    state = {}
    for name, shape in expected.items():
        tensor = state_dict[names[name]]
        if tuple(tensor.shape) != shape:
            raise CheckpointError(_("{where}: {name} has shape {shape}, config.json implies {expected}").format(
                where=where, name=name, shape=tuple(tensor.shape), expected=shape))
        state[name] = tensor.to(device=device, dtype=dtype)
    model.load_state_dict(state, assign=True)
    model.requires_grad_(False)
    return model.eval()
