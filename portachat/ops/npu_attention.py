"""Ascend's paged-attention and cache-write kernels for the engine's decode steps, and their self-tests
against the engine's portable paged attention (the fused prefill's are in ops/paged_attention.py).

Ascend's kernels keep the KV cache slot-major, [num_blocks, block_size, H_kv, D]; the portable path
(ops/paged_attention.py) reads it head-major, [H_kv, num_slots, D]. Where both kernels passed their
self-tests the engine allocates its cache slot-major (`allocate`) and hands every portable function the
head-major view of the same memory (a transpose, no copy): prefill chunks, and any step after a kernel
failed in use, read it as before, while `write_kv` and `decode_attention` give the kernels the
slot-major blocks. Each check fills both layouts with the same values, runs the kernel and the portable
function on the device, and compares in one layout.
"""

from __future__ import annotations

import torch

from portachat.device import npu_kernels
from portachat.device.device import Device
from portachat.device.fast_paths import Verdict, check
from portachat.ops import kv_quant
from portachat.ops import paged_attention as pa
from portachat.ops.fast_path import enabled, failed_in_use

BLOCKS, BLOCK, KV_HEADS, HEADS, DIM = 6, 16, 2, 4, 64


def _randn(dev: Device, *shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dev.torch_device, dev.dtype)


def slot_major(head_major: torch.Tensor, block_size: int) -> torch.Tensor:
    """[H_kv, num_slots, D] -> [num_blocks, block_size, H_kv, D] (a copy)."""
    h, slots, d = head_major.shape
    return head_major.transpose(0, 1).reshape(slots // block_size, block_size, h, d).contiguous()


def check_reshape_and_cache(dev: Device) -> Verdict:
    slots = torch.tensor([3, 17, 18, 40, 63, 95], device=dev.torch_device)
    k, v = _randn(dev, 6, KV_HEADS, DIM, seed=0), _randn(dev, 6, KV_HEADS, DIM, seed=1)

    def kernel() -> list[torch.Tensor]:
        kc = torch.zeros(BLOCKS, BLOCK, KV_HEADS, DIM, device=dev.torch_device, dtype=dev.dtype)
        vc = torch.zeros_like(kc)
        npu_kernels.reshape_and_cache(k, v, kc, vc, slots)
        return [kc, vc]

    def portable() -> list[torch.Tensor]:
        kc = torch.zeros(KV_HEADS, BLOCKS * BLOCK, DIM, device=dev.torch_device, dtype=dev.dtype)
        vc = torch.zeros_like(kc)
        pa.write_kv(kc, vc, slots, k, v)
        return [slot_major(kc, BLOCK), slot_major(vc, BLOCK)]

    return check("npu_reshape_and_cache", kernel, portable, dev.dtype)


def check_paged_attention(dev: Device) -> Verdict:
    """Three sequences of 5, 16 and 37 tokens in shuffled blocks; the last block of two is partly filled."""
    head_major_k = _randn(dev, KV_HEADS, BLOCKS * BLOCK, DIM, seed=2)
    head_major_v = _randn(dev, KV_HEADS, BLOCKS * BLOCK, DIM, seed=3)
    q = _randn(dev, 3, HEADS, DIM, seed=4)
    lengths = [5, 16, 37]
    table = torch.tensor([[4, 0, 0], [1, 0, 0], [5, 2, 3]], dtype=torch.int32)
    L = max(lengths)
    pos = torch.arange(L)
    slot_index = (table.long().gather(1, (pos // BLOCK)[None].expand(3, L).clamp(max=table.size(1) - 1)) * BLOCK
                  + pos % BLOCK)  # fmt: skip
    mask = (pos[None] < torch.tensor(lengths)[:, None]).view(3, 1, 1, L)

    def kernel() -> torch.Tensor:
        return npu_kernels.paged_attention(q, slot_major(head_major_k, BLOCK), slot_major(head_major_v, BLOCK),
                                           table.to(dev.torch_device), torch.tensor(lengths, dtype=torch.int32))

    def portable() -> torch.Tensor:
        return pa.decode_attention(q, head_major_k, head_major_v, slot_index.to(dev.torch_device),
                                mask.to(dev.torch_device))  # fmt: skip

    return check("npu_paged_attention", kernel, portable, dev.dtype)


# --- the engine's use ---------------------------------------------------------------------------------


def cache_slot_major(device: torch.device | str, kv_dtype: torch.dtype) -> bool:
    """Whether the engine keeps its cache slot-major for Ascend's kernels: both are this device's
    candidates and passed their self-tests here (runs them on first ask), and the cache holds plain
    floats (an int8/fp8 cache carries per-token scales the kernels do not read)."""
    return (not kv_quant.is_quantized(kv_dtype) and enabled("npu_reshape_and_cache", device, check_reshape_and_cache)
            and enabled("npu_paged_attention", device, check_paged_attention))  # fmt: skip


def allocate(shape: tuple[int, int, int, int], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A zeroed cache seen as [layers, H_kv, num_slots, D] (the portable functions' head-major layout) whose
    memory is slot-major, [layers, num_slots, H_kv, D]: `blocks` of a layer is a view, never a copy."""
    layers, heads, slots, dim = shape
    return torch.zeros(layers, slots, heads, dim, dtype=dtype, device=device).transpose(1, 2)


def blocks(cache: torch.Tensor, block_size: int) -> torch.Tensor:
    """One layer's head-major view [H_kv, num_slots, D] -> its memory as [num_blocks, block_size, H_kv, D]."""
    heads, _slots, dim = cache.shape
    return cache.transpose(0, 1).view(-1, block_size, heads, dim)


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             block_size: int) -> None:  # fmt: skip
    """ops/paged_attention.write_kv for a slot-major cache, through _npu_reshape_and_cache while it works."""
    if enabled("npu_reshape_and_cache", k.device, check_reshape_and_cache):
        try:
            # contiguous rows, as the kernel reads them (k and v may be column slices of a fused product)
            npu_kernels.reshape_and_cache(k.to(k_cache.dtype).contiguous(), v.to(v_cache.dtype).contiguous(),
                                          blocks(k_cache, block_size), blocks(v_cache, block_size), slots)  # fmt: skip
            return
        except Exception as e:  # a vendor kernel may raise anything; the portable write below replaces it
            failed_in_use("npu_reshape_and_cache", k.device, e)
    pa.write_kv(k_cache, v_cache, slots.long(), k, v)  # (the kernel's slots may be int32)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_size: int,
                     block_tables: torch.Tensor, context_lens: torch.Tensor, slot_index: torch.Tensor,
                     mask: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
    """ops/paged_attention.decode_attention for a slot-major cache, through _npu_paged_attention while it
    works: block_tables [B, max_blocks] int32 on the device, context_lens [B] int32 on the host; the
    portable path's slot_index and mask are kept for the fallback."""
    if enabled("npu_paged_attention", q.device, check_paged_attention):
        try:
            return npu_kernels.paged_attention(q.to(k_cache.dtype).contiguous(), blocks(k_cache, block_size),
                                               blocks(v_cache, block_size), block_tables, context_lens).to(q.dtype)
        except Exception as e:  # as in write_kv
            failed_in_use("npu_paged_attention", q.device, e)
    return pa.decode_attention(q, k_cache, v_cache, slot_index, mask)
