"""Fixed-size KV blocks: allocation, reference counts and prefix reuse.

The KV cache is `num_blocks * block_size` token slots. A sequence owns a block table (block ids in
order); token i of the sequence lives in slot `table[i // block_size] * block_size + i % block_size`.
A full block is identified by a hash of its tokens and of everything before it, so two prompts with
the same first blocks share them (refcount > 1) instead of computing and storing them twice; the
chain starts from the sequence's cache salt, so prompts run under different LoRA adapters (whose
keys and values differ) never share a block. A freed
block keeps its hash until it is handed out again, so a prompt that comes back soon still hits.
"""

from __future__ import annotations

from collections import OrderedDict

from portachat.engine.sequence import Sequence


def block_hash(previous: int | None, tokens: tuple[int, ...]) -> int:
    return hash((previous, tokens))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"need at least one block of at least one token, got {num_blocks} x {block_size}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.refcount = [0] * num_blocks
        self.hash_of: list[int | None] = [None] * num_blocks
        self.block_of_hash: dict[int, int] = {}
        # Free blocks in release order: allocation takes the oldest, so recently freed prefixes survive.
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.prefix_queries = 0  # prompt blocks looked up
        self.prefix_hits = 0  # ... and found cached

    # ------------------------------------------------------------------ queries

    @property
    def num_free(self) -> int:
        return len(self.free)

    def usage(self) -> float:
        return 1.0 - len(self.free) / self.num_blocks

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """New blocks `seq` needs to hold `num_tokens` tokens in total."""
        have = len(seq.block_table)
        want = -(-num_tokens // self.block_size)
        return max(0, want - have)

    # ------------------------------------------------------------------ allocation

    def _take_free(self) -> int:
        block, _ = self.free.popitem(last=False)
        old = self.hash_of[block]
        if old is not None:  # its cached prefix is overwritten from now on
            if self.block_of_hash.get(old) == block:
                del self.block_of_hash[old]
            self.hash_of[block] = None
        self.refcount[block] = 1
        return block

    def match_prefix(self, seq: Sequence) -> int:
        """Attach cached blocks for the longest cached prefix of a fresh sequence's tokens; returns
        the number of tokens they hold. The last token is always left to compute (its logits are needed)."""
        if not self.enable_prefix_caching or seq.block_table:
            return 0
        tokens = seq.token_ids
        full = (len(tokens) - 1) // self.block_size
        previous: int | None = seq.cache_salt
        for i in range(full):  # a miss ends the walk: later blocks hash over this one
            chunk = tuple(tokens[i * self.block_size : (i + 1) * self.block_size])
            h = block_hash(previous, chunk)
            block = self.block_of_hash.get(h)
            if block is None:
                break
            self.prefix_hits += 1
            if self.refcount[block] == 0:
                del self.free[block]
            self.refcount[block] += 1
            seq.block_table.append(block)
            seq.block_hashes.append(h)
            previous = h
        self.prefix_queries += full
        return len(seq.block_table) * self.block_size

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_needed(seq, num_tokens) <= len(self.free)

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Grow `seq`'s block table to hold `num_tokens` tokens (call can_allocate first)."""
        need = self.blocks_needed(seq, num_tokens)
        if need > len(self.free):
            raise RuntimeError(f"out of KV blocks: need {need}, {len(self.free)} free")
        for _ in range(need):
            seq.block_table.append(self._take_free())

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Shrink `seq`'s block table to what `num_tokens` tokens need (a rejected speculative tail).
        The blocks go back to the front of the free list: they hold nothing worth keeping, so they
        are handed out before blocks that still hold cached prefixes."""
        keep = -(-num_tokens // self.block_size)
        while len(seq.block_table) > max(keep, len(seq.block_hashes)):
            block = seq.block_table.pop()
            self.refcount[block] -= 1
            if self.refcount[block] == 0:
                self.free[block] = None
                self.free.move_to_end(block, last=False)

    def register_full_blocks(self, seq: Sequence) -> None:
        """Publish the hashes of blocks that `seq` has completely computed, for later prompts to reuse."""
        if not self.enable_prefix_caching:
            return
        full = seq.num_computed // self.block_size
        tokens = seq.token_ids
        while len(seq.block_hashes) < full:
            i = len(seq.block_hashes)
            previous = seq.block_hashes[-1] if seq.block_hashes else seq.cache_salt
            h = block_hash(previous, tuple(tokens[i * self.block_size : (i + 1) * self.block_size]))
            seq.block_hashes.append(h)
            block = seq.block_table[i]
            if h not in self.block_of_hash:
                self.block_of_hash[h] = block
                self.hash_of[block] = h

    def clear_prefix_cache(self) -> None:
        """Forget every cached prefix (their K/V were computed with weights that changed)."""
        self.block_of_hash.clear()
        self.hash_of = [None] * self.num_blocks

    def free_sequence(self, seq: Sequence) -> None:
        """Release every block of `seq` at once (finish, abort, preemption)."""
        for block in reversed(seq.block_table):  # tail first: the prefix is the last to be reused
            self.refcount[block] -= 1
            if self.refcount[block] == 0:
                self.free[block] = None
        seq.block_table.clear()
        seq.block_hashes.clear()
