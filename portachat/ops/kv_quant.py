"""Quantized KV cache: keys and values stored as int8 (or fp8) with one scale per token and kv head.

A quantized cache holds, per layer, `data` [H_kv, num_slots, D] in the storage dtype and `scale`
[H_kv, num_slots] fp32. Each new key/value vector is scaled on write so its largest element maps
to the storage type's largest value (127 for int8, 448 for fp8 e4m3): a scale per token and head
follows outliers of one token without hurting the others, needs no calibration, and costs 4 bytes
per D-element vector (6% at D = 64) — per-head static scales would save those bytes but need a
calibration pass and lose accuracy on any token louder than the calibration set.

Reads dequantize where it is cheapest: decode attention multiplies the raw integer keys and folds
the scales into the [.., L] scores and probabilities (G/D of the elements), prefill dequantizes the
gathered rows. Every op is plain torch with static shapes, so device graphs capture it as they
capture the float path. A prompt's first prefill chunk attends over its own keys before they are
stored (as vLLM's fp8 cache does); every later read (chunks that continue a sequence, decode steps)
sees the stored, quantized values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SCALE_DTYPE = torch.float32  # bf16 scales would add rounding as large as int8's own step
# Largest magnitude each storage dtype holds (the quantization grid's end).
QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0, torch.float8_e4m3fnuz: 240.0}


@dataclass
class QuantizedKV:
    """K or V of one layer ([H_kv, S, D] data, [H_kv, S] scales) or of all layers (a leading
    [n_layer] axis on both); indexing the first axis gives a layer's view, as with a plain tensor."""

    data: torch.Tensor
    scale: torch.Tensor

    def __getitem__(self, index) -> QuantizedKV:
        return QuantizedKV(self.data[index], self.scale[index])

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    @property
    def device(self) -> torch.device:
        return self.data.device


KVTensor = torch.Tensor | QuantizedKV


def is_quantized(dtype: torch.dtype) -> bool:
    return dtype in QMAX


def allocate(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> KVTensor:
    """A zeroed cache [..., H_kv, S, D]: a plain tensor for float dtypes, else data + scales."""
    if not is_quantized(dtype):
        return torch.zeros(shape, dtype=dtype, device=device)
    return QuantizedKV(torch.zeros(shape, dtype=dtype, device=device),
                       torch.zeros(shape[:-1], dtype=SCALE_DTYPE, device=device))  # fmt: skip


def bytes_per_token(n_layer: int, n_kv_head: int, head_dim: int, dtype: torch.dtype) -> int:
    """Cache bytes one token takes: K and V of every layer and kv head, scales included."""
    element = torch.empty((), dtype=dtype).element_size()
    scale = torch.empty((), dtype=SCALE_DTYPE).element_size() if is_quantized(dtype) else 0
    return 2 * n_layer * n_kv_head * (head_dim * element + scale)


def quantize(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] -> (values [..., D] in `dtype`, fp32 scales [...]) with x ~ values * scale."""
    qmax = QMAX[dtype]
    x = x.float()
    # max |x| in one op; the floor keeps an all-zero vector at scale ~0 instead of dividing by zero.
    scale = torch.linalg.vector_norm(x, ord=float("inf"), dim=-1).clamp_(min=1e-8).mul_(1.0 / qmax)
    y = x / scale.unsqueeze(-1)
    if dtype == torch.int8:
        y = y.round_()
    return y.clamp_(-qmax, qmax).to(dtype), scale


def write(
    k_cache: QuantizedKV, v_cache: QuantizedKV, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Quantize new keys and values [N, H_kv, D] into a layer's caches at `slots` [N]. Both go
    through one quantize call (half the small ops of a decode step's write)."""
    h = k.size(1)
    values, scale = quantize(torch.cat([k, v], dim=1).transpose(0, 1), k_cache.data.dtype)  # [2 H_kv, N, ...]
    for cache, rows in ((k_cache, slice(0, h)), (v_cache, slice(h, 2 * h))):
        _raw(cache.data).index_copy_(1, slots, _raw(values[rows]))
        cache.scale.index_copy_(1, slots, scale[rows])


def _raw(t: torch.Tensor) -> torch.Tensor:
    # torch lacks index_copy_ (and on some devices index_select) for fp8: move fp8 bytes as uint8.
    return t if t.dtype == torch.int8 else t.view(torch.uint8)


def _select(data: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    rows = _raw(data).index_select(1, index)
    return rows if rows.dtype == data.dtype else rows.view(data.dtype)


def gather(cache: QuantizedKV, index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Dequantized rows [H_kv, len(index), D] in `dtype` (multiplied in fp32, rounded once)."""
    data = _select(cache.data, index).float()
    return (data * cache.scale.index_select(1, index).unsqueeze(-1)).to(dtype)


def gather_raw(
    cache: QuantizedKV, index: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [H_kv, len(index), D] still unscaled, converted to `dtype` (exact: int8 and fp8 e4m3
    values are all representable in bf16, fp16 and fp32), and their fp32 scales [H_kv, len(index)]."""
    return _select(cache.data, index).to(dtype), cache.scale.index_select(1, index)
