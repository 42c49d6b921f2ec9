"""int8 weight-only quantization, symmetric per output channel (one scale per row of the weight).

A row's scale is rounded to bf16 *before* the weights are rounded to integers, so the int8 codes are
exact for the scale the kernel reads: the only error is the weight rounding itself (<= scale / 2).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

INT8_MAX = 127
# torch._weight_int8pack_mm on CPU returns NaN or crashes for reduction sizes that are not multiples of 16.
INT8_K_MULTIPLE = 16


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes int8 [N, K], scale bf16 [N]) with weight ~= codes * scale[:, None]."""
    w = weight.detach().float()
    scale = (w.abs().amax(dim=1) / INT8_MAX).clamp(min=1e-12).to(torch.bfloat16)
    codes = torch.round(w / scale.float()[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return codes, scale


def dequantize_int8(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return codes.float() * scale.float()[:, None]


class Int8Linear(nn.Module):
    """Drop-in for a bias-free nn.Linear: y = x @ (codes * scale).T, through ATen's int8 weight kernel.

    Attributes: in_features, out_features, qweight (int8 [out, in]), scale ([out]), bias (or None),
    activation_dtype (the kernel's input dtype; the output comes back in x's dtype). No `.weight`.
    `module.to(dtype)` may cast scale/bias; values stay exact (they were rounded to bf16) and forward
    hands the kernel the dtype it needs.
    """

    def __init__(
        self,
        qweight: torch.Tensor,
        scale: torch.Tensor,
        activation_dtype: torch.dtype,
        bias: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.out_features, self.in_features = qweight.shape
        self.activation_dtype = activation_dtype
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", scale.to(activation_dtype))
        self.register_buffer("bias", None if bias is None else bias.detach().clone())

    @classmethod
    def from_linear(cls, linear: nn.Linear, activation_dtype: torch.dtype = torch.bfloat16) -> Int8Linear:
        codes, scale = quantize_int8(linear.weight)
        device = linear.weight.device
        return cls(codes.to(device), scale.to(device), activation_dtype, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(self.activation_dtype)
        scale = (
            self.scale if self.scale.dtype == self.activation_dtype else self.scale.to(self.activation_dtype)
        )
        y = torch._weight_int8pack_mm(flat, self.qweight, scale).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.view(*x.shape[:-1], self.out_features)

    def dequantized_weight(self) -> torch.Tensor:
        return dequantize_int8(self.qweight, self.scale)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel"


class Int8Embedding(nn.Module):
    """Drop-in for nn.Embedding with int8 rows and one scale per row (a lookup dequantizes only the
    rows it reads). Tied models share `qweight`/`scale` with their Int8Linear output head.

    Attributes: num_embeddings, embedding_dim, qweight, scale. No `.weight`. The output dtype is
    `scale.dtype`, so `model.to(dtype)` moves the embedding's output along with the rest of the model.
    """

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = qweight.shape
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", scale)

    @classmethod
    def from_embedding(cls, embedding: nn.Embedding) -> Int8Embedding:
        codes, scale = quantize_int8(embedding.weight)
        device = embedding.weight.device
        return cls(codes.to(device), scale.to(device=device, dtype=embedding.weight.dtype))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        rows = F.embedding(idx, self.qweight).float() * self.scale[idx].float().unsqueeze(-1)
        return rows.to(self.scale.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, int8 per-row"
