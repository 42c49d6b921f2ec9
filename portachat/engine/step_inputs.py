"""What one forward pass takes: the flat batch of a step, already on the device."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class PrefillChunk:
    start: int  # row of the chunk's first token in the flat batch
    length: int
    slot_index: torch.Tensor | None  # [L] all slots up to the chunk's end; None when it starts at 0
    mask: torch.Tensor | None  # [T, L]


@dataclass
class SlotMajorCache:
    """Present where the KV cache is slot-major for Ascend's kernels (ops/npu_attention): the block size they
    read it by, every row's slot [N] as int32 (once per step, not per layer), and the decode rows' block
    tables [B, max_blocks] (int32, on the device) and context lengths [B] (int32, on the host, where
    _npu_paged_attention reads them); None without decode rows."""

    block_size: int
    slots: torch.Tensor
    block_tables: torch.Tensor | None
    context_lens: torch.Tensor | None


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [N]
    positions: torch.Tensor  # [N]
    slot_mapping: torch.Tensor  # [N]
    logits_rows: torch.Tensor  # [S] rows whose logits are sampled, in the scheduler's batch order
    num_decode: int  # rows 0..num_decode-1 are decode tokens
    decode_slots: torch.Tensor | None  # [B, L]
    decode_mask: torch.Tensor | None  # [B, 1, 1, L]
    prefills: list[PrefillChunk]
    # (adapter slot, rows [n]) per LoRA adapter used in the step; empty: every row is the base model
    lora_groups: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    slot_major: SlotMajorCache | None = None  # None: the head-major cache of the portable path


@dataclass
class StepPlan:
    """A step as host integers: `flat` holds input ids, positions, slots, logits rows, decode context
    lengths, decode block tables, continued chunks' block tables and LoRA rows, `sizes` their lengths."""

    flat: list[int]
    sizes: list[int]
    num_decode: int
    max_blocks: int
    chunks: list[tuple[int, int]]  # (start position, tokens) of each prefill chunk, in row order
    chunk_blocks: list[int]  # blocks of each continued chunk's table (chunks with start > 0)
    lora: list[tuple[int, int]] = field(default_factory=list)  # (adapter slot, rows) per LoRA adapter in the step
