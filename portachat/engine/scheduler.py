"""Which tokens of which sequences run in the next forward pass.

Every sequence is "tokens so far" plus "how many of them are in the KV cache"; a step computes some
of the rest. That one rule covers a prompt's prefill (many tokens, cut into chunks by the token
budget), a decode (one token), and the calculator's forced tokens (a few). Running sequences go
first, so decodes never starve behind a long prompt; waiting ones are admitted by priority (lower
first, vLLM's `priority`), then in arrival order, while budget, sequence slots and KV blocks last; a prompt whose leading blocks another running
sequence is still computing (the samples of an `n > 1` request, identical prompts arriving together)
waits for them and then takes them from the prefix cache instead of computing them again. When a running sequence needs a block and none is
free, the newest running sequence is preempted: its blocks are freed and it is recomputed later.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from portachat.engine.block_manager import BlockManager
from portachat.engine.sequence import Sequence, Status


@dataclass
class ScheduledSeq:
    seq: Sequence
    start: int  # first position computed this step
    num_tokens: int  # tokens of seq.token_ids computed this step
    # Speculative tokens run after them (speculative/): their K/V are written and each gets logits;
    # the engine keeps the accepted ones and rolls the rest back.
    draft: list[int] = field(default_factory=list)

    @property
    def samples(self) -> bool:
        """The chunk reaches the end of the sequence, so its last logits pick the next token."""
        return self.start + self.num_tokens == len(self.seq.token_ids)

    @property
    def num_rows(self) -> int:
        """Rows in the forward: the sequence's tokens, then the draft."""
        return self.num_tokens + len(self.draft)


class Scheduler:
    def __init__(self, blocks: BlockManager, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        """Queue `seq` behind every waiting sequence of its priority or a lower one (lower runs first,
        vLLM's rule): a request of priority 0 overtakes the server's waiting batch lines (priority 1)."""
        priority = seq.params.priority
        if self.waiting and self.waiting[-1].params.priority > priority:
            for i, other in enumerate(self.waiting):
                if other.params.priority > priority:
                    self.waiting.insert(i, seq)
                    return
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, seq: Sequence) -> None:
        """Take a sequence out of the queues and free its blocks (finish or abort)."""
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        elif seq.status is Status.WAITING:
            self.waiting.remove(seq)
        self.blocks.free_sequence(seq)
        seq.status = Status.FINISHED

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.free_sequence(seq)
        seq.num_computed = 0
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def _sibling_computing(self, seq: Sequence) -> bool:
        """A running sequence shares more full prompt blocks with `seq` than the cache gave it and
        has not computed them yet: admitting `seq` now would compute the same K/V a second time."""
        if not self.blocks.enable_prefix_caching:
            return False
        size = self.blocks.block_size
        full = (len(seq.token_ids) - 1) // size  # match_prefix leaves the last token to compute
        have = seq.num_computed // size
        if full <= have:
            return False
        for other in self.running:
            shared = 0  # full blocks equal from the start (a block's hash covers all before it)
            while shared < full and other.token_ids[shared * size : (shared + 1) * size] == \
                    seq.token_ids[shared * size : (shared + 1) * size]:
                shared += 1
            if shared > have and other.num_computed < shared * size:
                return True
        return False

    def schedule(self) -> list[ScheduledSeq]:
        budget = self.max_num_batched_tokens
        batch: list[ScheduledSeq] = []

        # 1. Running sequences, oldest first; the newest give way when blocks run out.
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_uncomputed, budget)
            while not self.blocks.can_allocate(seq, seq.num_computed + n):
                victim = self.running[-1]
                self._preempt(victim)
                if victim is seq:
                    break
            if seq.status is not Status.RUNNING:
                break  # it preempted itself: everything after it is gone too
            self.blocks.allocate(seq, seq.num_computed + n)
            batch.append(ScheduledSeq(seq, seq.num_computed, n))
            budget -= n
            i += 1

        # 2. Waiting sequences in arrival order, while budget, slots and blocks last.
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not seq.block_table:
                seq.num_computed = self.blocks.match_prefix(seq)
                if self._sibling_computing(seq):
                    self.blocks.free_sequence(seq)
                    seq.num_computed = 0
                    break
            n = min(seq.num_uncomputed, budget)
            if not self.blocks.can_allocate(seq, seq.num_computed + n):
                if not self.running and not batch:
                    # Nothing else holds blocks: take what fits, the rest follows in later chunks.
                    fit = (len(seq.block_table) + self.blocks.num_free) * self.blocks.block_size
                    n = min(n, fit - seq.num_computed)
                if n <= 0 or not self.blocks.can_allocate(seq, seq.num_computed + n):
                    self.blocks.free_sequence(seq)  # drop prefix-cache references taken above
                    seq.num_computed = 0
                    break
            self.waiting.popleft()
            self.blocks.allocate(seq, seq.num_computed + n)
            seq.status = Status.RUNNING
            self.running.append(seq)
            batch.append(ScheduledSeq(seq, seq.num_computed, n))
            budget -= n
        return batch
