"""Drafting with a small model: its own paged KV cache, block manager and runner, K forwards a step.

The draft keeps a per-request copy of the tokens it has cached. Before each proposal it keeps the
longest prefix that still matches the target's tokens (drafts the target rejected are dropped, like
the target's own rejected tail), feeds the rest in one chunk, then decodes K tokens one at a time,
all requests of the step batched together. Greedy requests take the draft's argmax; sampled ones
draw from the draft's distribution under the request's temperature/top-k/top-p, which is the q the
verifier needs. With a reduced vocabulary (draft_vocab) the head scores only the kept tokens: its rows
map back to token ids, and q is zero elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from portachat.engine.block_manager import BlockManager
from portachat.engine.runner import ModelRunner
from portachat.engine.scheduler import ScheduledSeq
from portachat.engine.sequence import Sequence
from portachat.engine.speculative.draft_vocab import trim_output_head
from portachat.engine.speculative.rejection import draw_from, processed_probs
from portachat.quant import model_dtype


@dataclass
class DraftState:
    """What the block manager and the runner read from a sequence, for the draft's own cache."""

    token_ids: list[int]
    num_computed: int = 0
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)


def common_prefix(a: list[int], b: list[int], limit: int) -> int:
    n = 0
    top = min(len(a), len(b), limit)
    while n < top and a[n] == b[n]:
        n += 1
    return n


class DraftModel:
    def __init__(self, model, num_blocks: int, block_size: int, max_model_len: int, device: torch.device,
                 vocab_size: int | None = None, keep_token_ids: tuple[int, ...] = ()) -> None:
        # The draft keeps the dtype it was loaded in (the target's, or its own quantized layout).
        model.to(device=device).eval()
        self.vocab_rows = model.lm_head.out_features  # the target's vocabulary (the draft shares it)
        self.token_ids = None if vocab_size is None else trim_output_head(model, vocab_size, keep_token_ids)
        dtype = model_dtype(model)
        self.model = model
        self.max_len = min(model.config.max_seq_len, max_model_len)
        self.blocks = BlockManager(num_blocks, block_size, enable_prefix_caching=False)
        self.runner = ModelRunner(model, num_blocks, block_size, self.max_len, device, dtype)
        self.states: dict[str, DraftState] = {}

    def release(self, request_id: str) -> None:
        state = self.states.pop(request_id, None)
        if state is not None:
            self.blocks.free_sequence(state)

    def _sync(self, seq: Sequence) -> DraftState:
        state = self.states.get(seq.request_id)
        if state is None:
            state = self.states[seq.request_id] = DraftState(list(seq.token_ids))
            return state
        state.num_computed = common_prefix(state.token_ids, seq.token_ids, state.num_computed)
        state.token_ids = list(seq.token_ids)
        self.blocks.trim(state, state.num_computed)
        return state

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[tuple[list[int], torch.Tensor | None]]:
        """Up to ks[i] tokens for seqs[i], with their draft distributions [k, V] for sampled requests."""
        states = [self._sync(seq) for seq in seqs]
        # The last draft token is never fed, so the positions fed end at len + k - 2.
        ks = [min(k, self.max_len + 1 - len(st.token_ids)) for k, st in zip(ks, states, strict=True)]
        drafts: list[list[int]] = [[] for _ in seqs]
        probs: list[list[torch.Tensor]] = [[] for _ in seqs]
        active = [i for i, k in enumerate(ks) if k > 0]
        while active:
            batch, rows = [], []
            for i in active:
                st = states[i]
                if not self.blocks.can_allocate(st, len(st.token_ids)):
                    continue  # the draft's cache is full: this request drafts no further this step
                self.blocks.allocate(st, len(st.token_ids))
                batch.append(ScheduledSeq(st, st.num_computed, len(st.token_ids) - st.num_computed))
                rows.append(i)
            if not batch:
                break
            logits = self.runner.forward(self.runner.prepare(batch))
            greedy = logits.argmax(dim=-1)
            if self.token_ids is not None:
                greedy = self.token_ids[greedy.cpu()]
            greedy = greedy.tolist()
            for r, i in enumerate(rows):
                params = seqs[i].params
                if params.temperature > 0:
                    q = self._full_vocab(processed_probs(logits[r : r + 1], params)[0])
                    token = draw_from(q, seqs[i].generator)
                    probs[i].append(q)
                else:
                    token = greedy[r]
                st = states[i]
                st.num_computed = len(st.token_ids)
                st.token_ids.append(token)
                drafts[i].append(token)
            active = [i for i in rows if len(drafts[i]) < ks[i]]
        return [(d, torch.stack(p) if p else None) for d, p in zip(drafts, probs, strict=True)]

    def _full_vocab(self, q: torch.Tensor) -> torch.Tensor:
        """The draft's distribution over the whole vocabulary (zero outside a reduced head's tokens)."""
        if self.token_ids is None:
            return q
        full = q.new_zeros(self.vocab_rows)
        full[self.token_ids.to(q.device)] = q
        return full
