"""Sleep and wake: an engine gives its KV cache's memory back while it is idle, and takes it again.

RL samples a batch of rollouts, then trains on them; while the trainer runs its forward and backward
the engine has nothing to do, and its KV cache (sized for a whole batch of prompts and replies) is
the largest thing it holds. `sleep` empties the cache tensors' storage in place (the same tensor
objects, so every view the runner keeps stays attached) and `wake` gives them their size back, zeroed.
Prefixes cached before the sleep are forgotten; decode graphs captured over the old addresses are
dropped and captured again.
"""

from __future__ import annotations

import torch

from portachat.engine.engine import LLMEngine
from portachat.engine.types import EngineError
from portachat.i18n import _


def kv_cache_tensors(engine: LLMEngine) -> list[torch.Tensor]:
    """The tensors holding the engine's KV cache: K and V (data and scales for a quantized cache)."""
    runner = engine.runner
    return [t for cache in (runner.k_cache, runner.v_cache)
            for t in ((cache.data, cache.scale) if hasattr(cache, "scale") else (cache,))]


def kv_cache_bytes(engine: LLMEngine) -> int:
    """Bytes the KV cache holds now (0 while asleep)."""
    return sum(t.untyped_storage().nbytes() for t in kv_cache_tensors(engine))


class KVSleep:
    """Sleep/wake for one engine; `asleep` says which state it is in."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.sizes: list[int] | None = None  # each cache tensor's storage bytes, while asleep

    @property
    def asleep(self) -> bool:
        return self.sizes is not None

    def sleep(self) -> int:
        """Free the KV cache; returns the bytes freed. Only between batches: no request in flight."""
        if self.asleep:
            return 0
        if self.engine.has_unfinished():
            raise EngineError(_("the engine cannot sleep with requests in flight"), kind="invalid")
        tensors = kv_cache_tensors(self.engine)
        self.sizes = [t.untyped_storage().nbytes() for t in tensors]
        for t in tensors:
            t.untyped_storage().resize_(0)
        self.engine.blocks.clear_prefix_cache()  # the keys and values they named are gone
        return sum(self.sizes)

    def wake(self) -> None:
        """Reallocate the KV cache (zeroed) after `sleep`; a no-op when awake."""
        if self.sizes is None:
            return
        for t, size in zip(kv_cache_tensors(self.engine), self.sizes, strict=True):
            t.untyped_storage().resize_(size)
            t.zero_()
        self.sizes = None
        runner = self.engine.runner
        if runner.graphs is not None:  # captured over the old addresses
            runner.enable_decode_graphs(self.engine.config.max_num_seqs, runner.graphs.capturer)
