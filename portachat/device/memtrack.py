"""Peak bytes held by live tensors, on any device, including CPU (where torch keeps no such counter).

A TorchDispatchMode sees every tensor an operator creates; each new storage is counted until Python
frees it. This is what `max_memory_allocated()` reports on accelerators, so estimates can be checked
against it on a plain CPU, and `tune batch-size` can enforce a memory limit there.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveTensorBytes(TorchDispatchMode):
    """Counts storages created while active. Tensors made before entering are not counted: build the
    model and optimizers inside the block to measure a whole training step from nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._sizes: dict[int, int] = {}

    def reset_peak(self) -> None:
        self.peak = self.live

    def _count(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key, size = storage.data_ptr(), storage.nbytes()
        if size == 0 or key in self._sizes:
            return
        self._sizes[key] = size
        self.live += size
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._forget, key)

    def _forget(self, key: int) -> None:
        size = self._sizes.pop(key, None)
        if size is not None:
            self.live -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self._count(t)
        return out
