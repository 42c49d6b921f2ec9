"""The engine's side of speculation: attach drafts before the forward, judge them after it.

    speculator.propose(batch, budget)      # drafts on the step's decodes, KV blocks allocated
    logits = runner.forward(runner.prepare(batch))   # drafts scored with the real tokens
    tokens = speculator.verify(s, rows)    # per sequence: accepted drafts + one target token
    ... the engine appends them one by one (stop rules cut exactly where plain decoding would) ...
    speculator.settle(s, fed)              # K/V of rejected drafts rolled back, blocks trimmed

Only single-token decodes speculate, and only in steps of at most `max_batch` sequences: a large batch already keeps the device busy, and verifying K more rows each would
cost more than the steps it saves.
"""

from __future__ import annotations

import torch

from portachat.engine.block_manager import BlockManager
from portachat.engine.scheduler import ScheduledSeq
from portachat.engine.sequence import Sequence
from portachat.engine.speculative.config import SpeculativeConfig
from portachat.engine.speculative.draft_model import DraftModel
from portachat.engine.speculative.ngram import propose_ngram
from portachat.engine.speculative.policy import speculation_allowed
from portachat.engine.speculative.rejection import verify_greedy, verify_sampled


class Speculator:
    def __init__(self, config: SpeculativeConfig, blocks: BlockManager, max_model_len: int,
                 device: torch.device) -> None:  # fmt: skip
        self.config = config
        self.blocks = blocks
        self.max_model_len = max_model_len
        self.draft: DraftModel | None = None
        if config.method == "draft_model":
            self.draft = DraftModel(config.draft, blocks.num_blocks, blocks.block_size, max_model_len, device,
                                    config.draft_vocab_size, config.keep_token_ids)
        self._draft_probs: dict[str, torch.Tensor] = {}
        # vLLM's counters: drafts (sequence-steps that speculated), draft tokens, accepted tokens.
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * config.num_speculative_tokens

    def _room(self, s: ScheduledSeq, budget: int, free_blocks: int) -> int:
        """Most draft tokens this sequence can take: K, what max_tokens and the context leave
        (every accepted draft is emitted, plus one), the step's token budget and free KV blocks."""
        seq, p = s.seq, s.seq.params
        n = len(seq.token_ids)
        free_slots = (len(seq.block_table) + free_blocks) * self.blocks.block_size - n
        return max(0, min(self.config.num_speculative_tokens, p.max_tokens - seq.num_output - 1,
                          self.max_model_len - n - 1, budget, free_slots))  # fmt: skip

    def propose(self, batch: list[ScheduledSeq], budget: int) -> None:
        """Attach drafts to the step's decodes that may speculate, allocating their KV slots."""
        decodes = [s for s in batch if s.num_tokens == 1 and s.samples]
        if not decodes or len(batch) > self.config.max_batch:
            return
        budget -= sum(s.num_tokens for s in batch)
        chosen: list[tuple[ScheduledSeq, int]] = []
        free_blocks = self.blocks.num_free  # shared by this step's drafts: each reserves its share
        for s in decodes:
            k = self._room(s, budget, free_blocks) if speculation_allowed(s.seq) else 0
            if k > 0:
                chosen.append((s, k))
                budget -= k
                free_blocks -= self.blocks.blocks_needed(s.seq, len(s.seq.token_ids) + k)
        if not chosen:
            return
        c = self.config
        if self.draft is None:
            proposals = [(propose_ngram(s.seq.token_ids, k, c.prompt_lookup_min, c.prompt_lookup_max,
                                        c.short_match_tokens), None) for s, k in chosen]  # fmt: skip
        else:
            proposals = self.draft.propose([s.seq for s, _ in chosen], [k for _, k in chosen])
        for (s, _), (draft, probs) in zip(chosen, proposals, strict=True):
            if not draft:
                continue
            self.blocks.allocate(s.seq, len(s.seq.token_ids) + len(draft))  # _room checked the blocks
            s.draft = draft
            if probs is not None:
                self._draft_probs[s.seq.request_id] = probs

    def verify(self, s: ScheduledSeq, logits: torch.Tensor) -> list[int]:
        """The tokens to emit for a speculating sequence, from its logits rows [len(draft) + 1, V]."""
        seq = s.seq
        probs = self._draft_probs.pop(seq.request_id, None)
        if seq.params.temperature > 0:
            tokens = verify_sampled(logits, s.draft, probs, seq.params, seq.generator)
        else:
            tokens = verify_greedy(logits, s.draft)
        accepted = len(tokens) - 1
        self.num_drafts += 1
        self.num_draft_tokens += len(s.draft)
        self.num_accepted_tokens += accepted
        for j in range(accepted):
            self.accepted_per_pos[j] += 1
        return tokens

    def settle(self, s: ScheduledSeq, fed: list[int]) -> None:
        """After the emitted tokens are appended: keep the K/V of positions whose fed token is still
        the sequence's token (the last one emitted never is: it has not been fed), drop the rest."""
        seq: Sequence = s.seq
        computed = s.start + 1
        while computed < len(fed) and computed < len(seq.token_ids) - 1 and fed[computed] == seq.token_ids[computed]:
            computed += 1
        seq.num_computed = computed
        self.blocks.register_full_blocks(seq)
        self.blocks.trim(seq, len(seq.token_ids))

    def release(self, request_id: str) -> None:
        """A request finished or failed: forget its draft state."""
        self._draft_probs.pop(request_id, None)
        if self.draft is not None:
            self.draft.release(request_id)

    def stats(self) -> dict:
        return {
            "spec_decode_num_drafts": self.num_drafts,
            "spec_decode_num_draft_tokens": self.num_draft_tokens,
            "spec_decode_num_accepted_tokens": self.num_accepted_tokens,
            "spec_decode_num_accepted_tokens_per_pos": list(self.accepted_per_pos),
        }
