"""A slotted KV cache for inference (nano-vllm flavour, kept simple).

Each running sequence owns one slot: a preallocated [n_kv_head, max_len, head_dim] region per layer,
plus its current length. A forward pass with the cache takes a batch of rows, each bound to a slot;
row b's tokens sit at positions lengths[slot_b] .. lengths[slot_b] + T - 1. That one rule covers a
prefill (lengths 0), a chunked prefill, and a continuous-batching decode step where every slot is
at a different position.

Lengths are host-side bookkeeping (a CPU tensor): the scheduler reads and writes them every step,
and keeping them off the accelerator means that never costs a device synchronisation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from portachat.model.config import GPTConfig


class KVCacheError(ValueError):
    """A cached forward that cannot be done: unknown or repeated slot, or a slot that is full."""


@dataclass
class CacheStep:
    """What one cached forward pass needs, prepared once on the host and shared by all layers."""

    rows: torch.Tensor  # [B] slot of each row, on device
    slots: torch.Tensor | None  # same as rows, or None when rows 0..B-1 use slots 0..B-1 (read as a view)
    positions: torch.Tensor  # [B, T] absolute positions of the new tokens, on device
    kv_len: int  # keys to attend to per row after this step (max over rows)
    attn_mask: torch.Tensor | None  # [B, 1, T, kv_len] bool, None when plain causal attention suffices
    fresh: bool  # every row starts at position 0: attend over the new keys only, causally


class KVCache:
    def __init__(
        self,
        n_layer: int,
        num_slots: int,
        n_kv_head: int,
        max_len: int,
        head_dim: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        for name, value in (
            ("n_layer", n_layer),
            ("num_slots", num_slots),
            ("n_kv_head", n_kv_head),
            ("max_len", max_len),
            ("head_dim", head_dim),
        ):
            if not isinstance(value, int) or value < 1:
                raise KVCacheError(f"KVCache {name} must be a positive integer, got {value!r}")
        shape = (n_layer, num_slots, n_kv_head, max_len, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.lengths = torch.zeros(num_slots, dtype=torch.long)  # host side, see module docstring
        self.num_slots = num_slots
        self.max_len = max_len

    @classmethod
    def for_model(
        cls,
        cfg: GPTConfig,
        num_slots: int,
        max_len: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> KVCache:
        return cls(cfg.n_layer, num_slots, cfg.n_kv_head, max_len, cfg.head_dim, device=device, dtype=dtype)

    @staticmethod
    def bytes_needed(
        cfg: GPTConfig, num_slots: int, max_len: int, dtype: torch.dtype = torch.bfloat16
    ) -> int:
        """Memory the cache would take, for sizing the number of slots before allocating."""
        element = torch.empty((), dtype=dtype).element_size()
        return 2 * cfg.n_layer * num_slots * cfg.n_kv_head * max_len * cfg.head_dim * element

    @property
    def device(self) -> torch.device:
        return self.k.device

    def reset(self, slots: Sequence[int] | torch.Tensor | None = None) -> None:
        """Free slots (all when None). Old keys stay in memory but are masked out by the length."""
        if slots is None:
            self.lengths.zero_()
        else:
            self.lengths[self._host_slots(slots, len(slots))] = 0

    def _host_slots(self, slots: Sequence[int] | torch.Tensor, batch: int) -> torch.Tensor:
        host = torch.as_tensor(slots, dtype=torch.long).cpu().reshape(-1)
        if host.numel() != batch:
            raise KVCacheError(f"got {host.numel()} slots for a batch of {batch} rows; pass one slot per row")
        if host.numel() and (host.min() < 0 or host.max() >= self.num_slots):
            raise KVCacheError(f"slots {host.tolist()} out of range: this cache has {self.num_slots} slots")
        if host.unique().numel() != host.numel():
            raise KVCacheError(f"slots {host.tolist()} repeat a slot; each row needs its own slot")
        return host

    def prepare(
        self, batch: int, seq_len: int, slots: Sequence[int] | torch.Tensor | None
    ) -> tuple[CacheStep, torch.Tensor]:
        """Plan a forward of [batch, seq_len] new tokens; returns the step and the host slot indices."""
        if batch < 1 or seq_len < 1:
            raise KVCacheError(
                f"nothing to run: a cached forward needs at least one token, got [{batch}, {seq_len}]"
            )
        if slots is None:
            if batch > self.num_slots:
                raise KVCacheError(f"batch of {batch} rows but the cache has only {self.num_slots} slots")
            host = torch.arange(batch)
        else:
            host = self._host_slots(slots, batch)
        starts = self.lengths[host]
        ends = starts + seq_len
        if int(ends.max()) > self.max_len:
            full = host[ends > self.max_len].tolist()
            raise KVCacheError(
                f"slots {full} would exceed the cache length {self.max_len} (lengths {starts.tolist()} + "
                f"{seq_len} new tokens); allocate a longer KVCache or reset the slot"
            )
        device = self.device
        offsets = torch.arange(seq_len)
        positions = (starts[:, None] + offsets[None, :]).to(device)
        kv_len = int(ends.max())
        fresh = bool((starts == 0).all())
        same_start = bool((starts == starts[0]).all())
        attn_mask = None
        if not fresh and not (same_start and seq_len == 1):
            # Row b, query t sees keys 0..start_b + t: causal within the new tokens, and nothing past
            # the row's own length (other slots in the batch may be longer).
            keys = torch.arange(kv_len)
            allowed = keys[None, None, :] <= (starts[:, None] + offsets[None, :])[:, :, None]
            attn_mask = allowed[:, None].to(device)
        rows = host.to(device)
        dev_slots = None if torch.equal(host, torch.arange(batch)) else rows
        return CacheStep(rows, dev_slots, positions, kv_len, attn_mask, fresh), host

    def update(
        self, layer: int, step: CacheStep, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this layer's new k/v [B, H_kv, T, D] and return the keys/values to attend over."""
        batch = k.size(0)
        kl, vl = self.k[layer], self.v[layer]
        rows = step.rows[:, None]
        # Advanced indices around a slice put the indexed dims first: the target is [B, T, H_kv, D].
        kl[rows, :, step.positions] = k.transpose(1, 2).to(kl.dtype)
        vl[rows, :, step.positions] = v.transpose(1, 2).to(vl.dtype)
        if step.fresh:
            return k, v
        if step.slots is None:
            keys, values = kl[:batch, :, : step.kv_len], vl[:batch, :, : step.kv_len]
        else:
            keys = kl[:, :, : step.kv_len].index_select(0, step.slots)
            values = vl[:, :, : step.kv_len].index_select(0, step.slots)
        return keys.to(k.dtype), values.to(v.dtype)

    def advance(self, host_slots: torch.Tensor, seq_len: int) -> None:
        self.lengths[host_slots] += seq_len
