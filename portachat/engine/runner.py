"""The model runner: one forward pass over a flat batch of tokens from many sequences.

Prefill chunks and decode tokens of different sequences are concatenated into one [N] batch: the
embeddings, projections, norms and MLPs (nearly all of the FLOPs and weight reads) run once over it;
only attention is per group (all decode tokens together, each prefill chunk on its own), reading
keys and values from the paged cache. Everything the step needs from the host goes to the device
in one copy. Logits are computed only at the positions that sample.
"""

from __future__ import annotations

import warnings

import torch

from portachat.device.graphs import GraphCapturer
from portachat.device.inference import kv_cache_dtype
from portachat.engine.decode_graphs import DecodeGraphs, PaddedDecode
from portachat.engine.module_ops import ModuleLayerOps
from portachat.engine.packed_forward import PackedModel
from portachat.engine.scheduler import ScheduledSeq
from portachat.engine.step_inputs import PrefillChunk, SlotMajorCache, StepInputs, StepPlan
from portachat.i18n import _
from portachat.model.gpt import GPT
from portachat.model.layer_ops import decoder_layer
from portachat.model.lora_batch import AdapterSet
from portachat.ops import kv_quant, npu_attention


def rotary_tables(model: GPT, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 cos/sin [length, head_dim] from the model (its public `rotary` once it has one)."""
    if hasattr(model, "rotary"):
        cos, sin = model.rotary(length, device)
    else:
        cos, sin = model._rotary(length)
    return cos[:length].to(device=device, dtype=torch.float32), sin[:length].to(
        device=device, dtype=torch.float32
    )


def adapter_of(s: ScheduledSeq) -> str | None:
    """The LoRA adapter a scheduled sequence runs with (a draft model's sequences carry no params)."""
    params = getattr(s.seq, "params", None)
    return params.adapter if params is not None else None


class ModelRunner:
    def __init__(
        self,
        model: GPT,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        device: torch.device,
        dtype: torch.dtype,
        kv_dtype: torch.dtype | None = None,
    ) -> None:
        self.model = model
        self.device = device
        self.dtype = dtype
        self.block_size = block_size
        cfg = model.config
        # One block more than the block manager hands out: padded rows of a graph-replayed decode
        # step write their keys and values there.
        self.scratch_block = num_blocks
        self.num_slots = (num_blocks + 1) * block_size
        # head-major (see paged_attention); a tensor-parallel shard's config counts only its own kv heads
        shape = (cfg.n_layer, cfg.n_kv_head, self.num_slots, cfg.head_dim)
        # None: the device layer's default; int8/fp8 caches are data + per-token scales (kv_quant).
        self.kv_dtype = kv_dtype or kv_cache_dtype(device, dtype)
        # Slot-major memory where Ascend's cache-write and paged-attention kernels passed their self-tests
        # (the same head-major view for everything else, see ops/npu_attention).
        self.slot_major = npu_attention.cache_slot_major(device, self.kv_dtype)
        allocate = npu_attention.allocate if self.slot_major else kv_quant.allocate
        self.k_cache = allocate(shape, self.kv_dtype, device)
        self.v_cache = allocate(shape, self.kv_dtype, device)
        self.cos, self.sin = rotary_tables(model, max_model_len, device)
        half = cfg.head_dim // 2
        self.sin_signed = torch.cat([-self.sin[:, :half], self.sin[:, half:]], dim=-1)  # rotate_half as a roll
        # Packed copies would go stale under a model that is still training (RL): pack frozen weights only.
        frozen = not any(p.requires_grad for p in model.parameters())
        self.packed = PackedModel.build(model) if frozen else None
        self._compiled = None
        self.max_model_len = max_model_len
        self.graphs: DecodeGraphs | None = None
        self.lora: AdapterSet | None = None  # LoRA adapters that rows may use (the engine adds them)
        self.lora_steps = self.lora_mixed_steps = 0  # steps with adapter rows; with rows of several models

    def reload_weights(self) -> None:
        """Re-pack after the model's weights changed in place (a no-op when nothing is packed).
        Captured graphs stay valid: they read the weights where they are."""
        if self.packed is not None:
            self.packed = PackedModel.build(self.model)

    def enable_compile(self) -> None:
        """torch.compile the forward (shapes vary every step: compiled with dynamic shapes)."""
        self._compiled = torch.compile(self._forward, dynamic=True)

    def enable_decode_graphs(self, max_num_seqs: int, capturer: GraphCapturer | None) -> None:
        """Run decode-only steps padded to buckets, replayed from graphs `capturer` records
        (None: the padded steps run eagerly, e.g. to test the padding on a CPU)."""
        self.graphs = DecodeGraphs(self._forward_modules, self.block_size, self.scratch_block, max_num_seqs,
                                   self.max_model_len, self.model.config.vocab_size, self.device,
                                   capturer)  # fmt: skip

    # ------------------------------------------------------------------ inputs

    def prepare(self, batch: list[ScheduledSeq]) -> StepInputs | PaddedDecode:
        """Host-side bookkeeping for a step, shipped to the device in one copy."""
        adapters = [adapter_of(s) for s in batch]
        if self.graphs is not None and not any(adapters) and self.graphs.fits(batch):
            return self.graphs.prepare(batch)  # graphs replay base-model steps only
        return self.to_device(self.plan(batch))

    def plan(self, batch: list[ScheduledSeq]) -> StepPlan:
        """The step as plain host integers (what tensor-parallel workers receive in one broadcast)."""
        bs = self.block_size
        decodes = [s for s in batch if s.num_rows == 1]
        chunks = [s for s in batch if s.num_rows > 1]  # prefill chunks and speculative verifications
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        first_row: dict[int, int] = {}
        for s in decodes + chunks:
            first_row[id(s)] = len(ids)
            table = s.seq.block_table
            for p in range(s.start, s.start + s.num_rows):
                positions.append(p)
                slots.append(table[p // bs] * bs + p % bs)
            ids.extend(s.seq.token_ids[s.start : s.start + s.num_tokens])
            ids.extend(s.draft)
        # Logits come back in the caller's batch order, whatever order the rows run in: one row per
        # sampling sequence, plus one per draft token before it (the target's verdict on each).
        logits_rows = [first_row[id(s)] + s.num_tokens - 1 + j for s in batch if s.samples
                       for j in range(len(s.draft) + 1)]  # fmt: skip
        # Decode block tables, padded with block 0 (masked out), and context lengths.
        context = [s.start + 1 for s in decodes]
        max_blocks = -(-max(context) // bs) if decodes else 0
        dec_tables: list[int] = []
        for s in decodes:
            table = s.seq.block_table[:max_blocks]
            dec_tables.extend(table + [0] * (max_blocks - len(table)))
        # Block tables of chunks that continue a sequence (prefix hit, or second chunk onwards).
        chunk_tables: list[int] = []
        chunk_blocks: list[int] = []
        for s in chunks:
            if s.start > 0:
                n = -(-(s.start + s.num_rows) // bs)
                chunk_tables.extend(s.seq.block_table[:n])
                chunk_blocks.append(n)
        # Rows of each LoRA adapter in the step (grouped products); none when every row is the base.
        lora_rows: dict[int, list[int]] = {}
        for s in decodes + chunks:
            if (adapter := adapter_of(s)) is not None:
                first = first_row[id(s)]
                lora_rows.setdefault(self.lora.slot(adapter), []).extend(
                    range(first, first + s.num_rows))  # draft rows too: the target verifies them
        if lora_rows:
            self.lora_steps += 1
            self.lora_mixed_steps += len({adapter_of(s) for s in batch}) > 1
        lora_flat = [r for rows in lora_rows.values() for r in rows]
        parts = [ids, positions, slots, logits_rows, context, dec_tables, chunk_tables, lora_flat]
        return StepPlan([x for part in parts for x in part], [len(p) for p in parts], len(decodes), max_blocks,
                        [(s.start, s.num_rows) for s in chunks], chunk_blocks,
                        [(slot, len(rows)) for slot, rows in lora_rows.items()])  # fmt: skip

    def to_device(self, plan: StepPlan) -> StepInputs:
        """The step's tensors on the device, from one host-to-device copy of the plan."""
        bs = self.block_size
        flat = torch.tensor(plan.flat, dtype=torch.long).to(self.device, non_blocking=True)
        input_ids, pos_t, slot_t, rows_t, ctx_t, dec_t, chunk_t, lora_t = torch.split(flat, plan.sizes)
        num_decode, max_blocks = plan.num_decode, plan.max_blocks
        decode_slots = decode_mask = None
        context = plan.flat[sum(plan.sizes[:4]) : sum(plan.sizes[:5])]
        if num_decode:
            L = max(context)
            within = torch.arange(bs, device=self.device)
            decode_slots = (dec_t.view(num_decode, max_blocks, 1) * bs + within).view(num_decode, -1)[:, :L]
            if min(context) != L:  # rows of different lengths: hide each row's padding
                decode_mask = (torch.arange(L, device=self.device)[None, :] < ctx_t[:, None])[
                    :, None, None, :
                ]
        prefills: list[PrefillChunk] = []
        row = num_decode
        table_at = 0
        block_iter = iter(plan.chunk_blocks)
        for start, num_tokens in plan.chunks:
            slot_index = mask = None
            if start > 0:
                n = next(block_iter)
                table = chunk_t[table_at : table_at + n]
                table_at += n
                end = start + num_tokens
                slot_index = (table[:, None] * bs + torch.arange(bs, device=self.device)).view(-1)[:end]
                query_pos = torch.arange(start, end, device=self.device)
                mask = torch.arange(end, device=self.device)[None, :] <= query_pos[:, None]
            prefills.append(PrefillChunk(row, num_tokens, slot_index, mask))
            row += num_tokens
        slot_major = None
        if self.slot_major:  # Ascend's kernels read block tables and, on the host, context lengths
            tables = dec_t.view(num_decode, max_blocks).to(torch.int32) if num_decode else None
            slot_major = SlotMajorCache(bs, slot_t.to(torch.int32), tables,
                                        torch.tensor(context, dtype=torch.int32) if num_decode else None)
        lora_groups = list(zip([slot for slot, _n in plan.lora], torch.split(lora_t, [n for _s, n in plan.lora]),
                               strict=True))
        return StepInputs(input_ids, pos_t, slot_t, rows_t, num_decode, decode_slots, decode_mask, prefills,
                          lora_groups, slot_major)

    # ------------------------------------------------------------------ forward

    @torch.inference_mode()
    def forward(self, inp: StepInputs | PaddedDecode) -> torch.Tensor:
        """fp32 logits [S, V] at `inp.logits_rows`."""
        if isinstance(inp, PaddedDecode):
            return self.graphs.run(inp)
        if self._compiled is None or inp.lora_groups:  # adapter steps run eager: their groups vary
            return self._forward(inp)
        try:
            return self._compiled(inp)
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:  # a compiler failure must not take the engine down: run eager from now on
            warnings.warn(_("compiled forward failed ({error}); continuing eager").format(
                error=f"{type(exc).__name__}: {exc}"), stacklevel=2)
            self._compiled = None
            return self._forward(inp)

    def _forward(self, inp: StepInputs) -> torch.Tensor:
        if self.packed is not None:
            return self.packed.forward(inp, self.k_cache, self.v_cache, self.cos, self.sin_signed, self.lora)
        return self._forward_modules(inp)

    def _forward_modules(self, inp: StepInputs) -> torch.Tensor:
        """The model's own modules over the flat batch (accelerators, quantized or training models)."""
        model = self.model
        x = model.model.embed_tokens(inp.input_ids)  # [N, C]
        ops = ModuleLayerOps(model, inp, self.k_cache, self.v_cache, self.cos, self.sin, x.dtype)
        for i in range(len(model.model.layers)):
            x = decoder_layer(ops, i, x, self.lora, inp.lora_groups)
        x = model.model.norm(x[inp.logits_rows])
        return model.lm_head(x).float()
