"""Chat batches: masks become -1 targets, packing keeps conversations whole, positions resume."""

from __future__ import annotations

import functools

import pytest
import torch

from portachat.data.chat_data import synthetic_conversations
from portachat.data.chat_loader import ChatLoader, iter_chat_val_batches
from portachat.device.shapes import pad_bucket
from portachat.tokenizer import render_conversation


def test_padded_rows_hold_one_conversation_with_its_mask(small_tokenizer):
    convs = synthetic_conversations(6, seed=1)
    loader = ChatLoader(convs, small_tokenizer, batch_size=3, seq_len=200, pack=False, seed=0)
    batch = loader.next_batch()
    width = batch.inputs.shape[1]
    assert batch.inputs.shape == batch.targets.shape == (3, width) and width < 200  # the longest row's bucket
    assert width == pad_bucket(max(batch.lengths), 200)
    for r in range(3):
        bos_positions = (batch.inputs[r] == small_tokenizer.bos_id).nonzero().flatten().tolist()
        ids, mask = None, None
        for conv in convs:  # find which conversation this row holds
            cand_ids, cand_mask = render_conversation(small_tokenizer, conv["messages"])
            if batch.inputs[r, : len(cand_ids) - 1].tolist() == cand_ids[:-1]:
                ids, mask = cand_ids, cand_mask
        assert ids is not None and bos_positions[0] == 0
        expected = [t if m else -1 for t, m in zip(ids[1:], mask[1:], strict=True)]
        assert batch.targets[r, : len(expected)].tolist() == expected
        assert (batch.targets[r, len(expected):] == -1).all()  # padding is never a target


def test_packed_rows_keep_conversations_whole_and_resume_exactly(small_tokenizer):
    convs = synthetic_conversations(40, seed=2)
    loader = ChatLoader(convs, small_tokenizer, batch_size=2, seq_len=128, pack=True, stream=1, num_streams=2, seed=3)
    first = loader.next_batch()
    # Several conversations per row, each starting with bos; a cut conversation would not end with assistant_end.
    end = small_tokenizer.special_ids["<|assistant_end|>"]
    for r in range(2):
        row = first.inputs[r].tolist() + [first.targets[r, -1].item()]
        starts = [i for i, t in enumerate(row) if t == small_tokenizer.bos_id]
        assert len(starts) >= 2
        for a in starts[1:]:
            assert row[a - 1] in (end, small_tokenizer.bos_id)
    state = loader.state_dict()
    after = [loader.next_batch() for _ in range(3)]
    again = ChatLoader(convs, small_tokenizer, batch_size=2, seq_len=128, pack=True, stream=1, num_streams=2, seed=3)
    again.load_state_dict(state)
    for a, b in zip(after, [again.next_batch() for _ in range(3)], strict=True):
        assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)


def test_streams_read_disjoint_conversations(small_tokenizer):
    convs = synthetic_conversations(8, seed=4)
    rows = []
    for s in range(2):
        loader = ChatLoader(convs, small_tokenizer, batch_size=4, seq_len=256, pack=False, stream=s, num_streams=2)
        rows.append({tuple(r.tolist()) for r in loader.next_batch().inputs})
    assert not rows[0] & rows[1]


def test_validation_batches_cover_each_conversation_once(small_tokenizer):
    convs = synthetic_conversations(7, split="heldout", seed=5)
    batches = list(iter_chat_val_batches(convs, small_tokenizer, batch_size=3, seq_len=256))
    assert [b[0].shape[0] for b in batches] == [3, 3, 1]
    supervised = sum(int((t >= 0).sum()) for _, t in batches)
    assert supervised == sum(sum(render_conversation(small_tokenizer, c["messages"])[1][1:]) for c in convs)


def test_synthetic_conversations_follow_the_task_weights():
    convs = synthetic_conversations(300, seed=6, weights={"comparison": 3.0, "spelling": 1.0, "calc_arithmetic": 0.0,
                                                          "mental_arithmetic": 0.0, "letter_count": 0.0})
    tasks = [c["task"] for c in convs]
    assert set(tasks) == {"comparison", "spelling"}
    assert 0.65 < tasks.count("comparison") / len(tasks) < 0.85
    assert all(c["answer"] and c["messages"][-1]["role"] == "assistant" for c in convs)
    default = [c["task"] for c in synthetic_conversations(300, seed=6)]
    assert len(set(default)) == 5  # no weights: the curriculum's own mix


def _identify(batch, rendered):
    """Which conversations a padded batch holds (by their rendered ids)."""
    found = []
    for r in range(batch.inputs.size(0)):
        row = batch.inputs[r].tolist()
        hits = [i for i, (ids, _m) in rendered.items() if row[: len(ids) - 1] == ids[:-1]]
        assert hits, "a row that is no conversation"
        found.append(hits[0])
    return found


def test_token_budget_batches_respect_the_budget_cover_every_row_once_and_resume_exactly(small_tokenizer):
    convs = synthetic_conversations(90, seed=7)
    budget, seq = 600, 200
    rendered = {i: render_conversation(small_tokenizer, c["messages"], seq + 1) for i, c in enumerate(convs)}
    assert len({tuple(ids) for ids, _m in rendered.values()}) == len(convs)  # every row is recognisable

    def loader():
        return ChatLoader(convs, small_tokenizer, batch_size=1, seq_len=seq, pack=False, stream=1, num_streams=2,
                          seed=5, tokens_per_batch=budget)

    first = loader()
    mine = sorted(first._epoch_order())
    plan = first.epoch_plan()
    seen, sizes = [], []
    for _ in plan:
        batch = first.next_batch()
        assert batch.inputs.numel() <= budget  # rows x padded length within the budget
        seen += _identify(batch, rendered)
        sizes.append(batch.inputs.size(0))
    assert sorted(seen) == mine  # this stream's share, each conversation exactly once
    assert max(sizes) > 2 and first.epoch == 1 and first.index == 0  # several rows per batch; the epoch ended
    # Resume mid-epoch (and across the next epoch's start) from the saved position.
    again = loader()
    for _ in range(3):
        again.next_batch()
    state = again.state_dict()
    expected = [again.next_batch() for _ in range(len(plan))]
    resumed = loader()
    resumed.load_state_dict(state)
    for a, b in zip(expected, [resumed.next_batch() for _ in range(len(plan))], strict=True):
        assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    # The order is seeded: another seed, another plan; the next epoch, another plan.
    other_seed = ChatLoader(convs, small_tokenizer, batch_size=1, seq_len=seq, pack=False, stream=1, num_streams=2,
                            seed=6, tokens_per_batch=budget)
    assert other_seed.epoch_plan() != plan and first.epoch_plan() != plan


def test_token_budget_batches_sort_by_length_so_little_is_padding(small_tokenizer):
    convs = synthetic_conversations(200, seed=9)
    fine = functools.partial(pad_bucket, fine=True)
    by_budget = ChatLoader(convs, small_tokenizer, 8, 256, pack=False, tokens_per_batch=1024, bucket=fine)
    fixed = ChatLoader(convs, small_tokenizer, 8, 256, pack=False, bucket=fine, group_by_length=False)

    def padding(loader, n):
        batches = [loader.next_batch() for _ in range(n)]
        return 1 - sum(b.num_real() for b in batches) / sum(b.inputs.numel() for b in batches)

    assert padding(by_budget, len(by_budget.epoch_plan())) < 0.5 * padding(fixed, 25)


def test_token_budget_below_a_row_is_refused(small_tokenizer):
    with pytest.raises(ValueError, match="at least --max-seq-len"):
        ChatLoader(synthetic_conversations(4, seed=1), small_tokenizer, 2, 256, pack=False, tokens_per_batch=100)


def test_packed_rows_carry_positions_that_restart_per_conversation(small_tokenizer):
    convs = synthetic_conversations(40, seed=2)
    loader = ChatLoader(convs, small_tokenizer, batch_size=2, seq_len=256, pack=True, seed=1)
    batch = loader.next_batch()
    assert batch.positions is not None and batch.positions.shape == batch.inputs.shape
    for r in range(2):
        starts = (batch.positions[r] == 0).nonzero().flatten().tolist()
        bos = [i for i, t in enumerate(batch.inputs[r].tolist()) if t == small_tokenizer.bos_id]
        assert len(starts) >= 2 and starts == bos[: len(starts)]  # each conversation starts at position 0, at its bos
        for a in starts[1:]:
            assert batch.targets[r, a - 1] == -1  # nothing is trained to predict the next conversation's start
    assert sum(batch.lengths) == batch.num_real() <= batch.inputs.numel()


def test_padded_rows_come_in_batches_of_similar_length_every_row_once(small_tokenizer):
    convs = synthetic_conversations(50, seed=10)
    fine = functools.partial(pad_bucket, fine=True)
    grouped = ChatLoader(convs, small_tokenizer, 4, 256, pack=False, bucket=fine, seed=2)
    anyhow = ChatLoader(convs, small_tokenizer, 4, 256, pack=False, bucket=fine, seed=2, group_by_length=False)
    lengths = {i: len(render_conversation(small_tokenizer, c["messages"], 257)[0]) for i, c in enumerate(convs)}
    order = grouped._epoch_order()
    assert sorted(order) == list(range(50)) and order != sorted(order, key=lengths.get)  # all once, batches shuffled
    batches = [grouped.next_batch() for _ in range(13)]  # 12 of 4 and the epoch's short last one of 2
    assert [b.inputs.size(0) for b in batches] == [4] * 12 + [2] and grouped.epoch == 1 and grouped.index == 0
    assert grouped.next_batch().inputs.size(0) == 4  # the next epoch starts a batch of its own
    padding = 1 - sum(b.num_real() for b in batches) / sum(b.inputs.numel() for b in batches)
    plain = [anyhow.next_batch() for _ in range(13)]
    assert padding < 0.5 * (1 - sum(b.num_real() for b in plain) / sum(b.inputs.numel() for b in plain))


def test_a_packed_row_gives_each_conversation_the_loss_it_has_alone(small_tokenizer):
    from portachat.data.chat_loader import rows_to_batch
    from portachat.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=384, n_layer=2, n_embd=32, n_head=2, n_kv_head=1, head_dim=16,
                          intermediate_size=64, max_seq_len=256)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    convs = synthetic_conversations(40, seed=2)
    loader = ChatLoader(convs, small_tokenizer, batch_size=1, seq_len=256, pack=True, seed=1)
    batch = loader.next_batch()
    starts = (batch.positions[0] == 0).nonzero().flatten().tolist()
    assert len(starts) >= 3
    with torch.no_grad():
        packed = model(batch.inputs, batch.targets, loss_reduction="none", positions=batch.positions)[0]
        for a, b in zip(starts, starts[1:], strict=False):
            ids = batch.inputs[0, a:b].tolist() + [batch.inputs[0, b].item()]  # the conversation and the next bos
            mask = [0] + [int(t >= 0) for t in batch.targets[0, a : b - 1].tolist()] + [0]
            alone = rows_to_batch([(ids, mask)], small_tokenizer.bos_id, 256)
            own = model(alone.inputs, alone.targets, loss_reduction="none")[0]
            assert packed[a:b].sum().item() == pytest.approx(own.sum().item(), rel=1e-5, abs=1e-5)
            assert (packed[a:b] != 0).sum() == (own != 0).sum() > 0
