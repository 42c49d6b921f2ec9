"""Self-tests of Ascend's paged-attention and cache-write kernels against the engine's portable paged
attention (the fused prefill's is in ops/paged_attention.py, where it runs).

Ascend's kernels keep the KV cache slot-major, [num_blocks, block_size, H_kv, D]; the portable path
(ops/paged_attention.py) keeps it head-major, [H_kv, num_slots, D]. Each check fills both layouts with the
same values, runs the kernel and the portable function on the device, and compares in one layout.
"""

from __future__ import annotations

import torch

from portachat.device import npu_kernels
from portachat.device.device import Device
from portachat.device.fast_paths import Verdict, check
from portachat.ops.paged_attention import decode_attention, write_kv

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
        write_kv(kc, vc, slots, k, v)
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
        return decode_attention(q, head_major_k, head_major_v, slot_index.to(dev.torch_device),
                                mask.to(dev.torch_device))  # fmt: skip

    return check("npu_paged_attention", kernel, portable, dev.dtype)
