"""vLLM's `priority` in the scheduler: waiting sequences are admitted lowest priority first, then in
arrival order, so an interactive request (0) overtakes the server's waiting batch lines (1)."""

from __future__ import annotations

from portachat.engine.block_manager import BlockManager
from portachat.engine.detokenizer import Detokenizer
from portachat.engine.scheduler import Scheduler
from portachat.engine.sequence import Sequence
from portachat.engine.types import SamplingParams


def seq(rid: str, priority: int, arrival: int) -> Sequence:
    return Sequence(rid, [1, 2, 3, 4], SamplingParams(priority=priority), Detokenizer(lambda t: b"", []), None,
                    arrival)


def admitted(scheduler: Scheduler) -> list[str]:
    return [s.seq.request_id for s in scheduler.schedule() if s.start == 0]


def test_lower_priority_value_is_admitted_first_and_ties_keep_arrival_order():
    scheduler = Scheduler(BlockManager(num_blocks=64, block_size=4), max_num_seqs=2, max_num_batched_tokens=64)
    for i in range(3):
        scheduler.add(seq(f"batch-{i}", 1, i))
    scheduler.add(seq("chat-a", 0, 3))
    scheduler.add(seq("chat-b", 0, 4))
    scheduler.add(seq("urgent", -1, 5))
    assert [s.request_id for s in scheduler.waiting] == ["urgent", "chat-a", "chat-b", "batch-0", "batch-1", "batch-2"]
    assert admitted(scheduler) == ["urgent", "chat-a"]  # two slots: the batch lines wait
