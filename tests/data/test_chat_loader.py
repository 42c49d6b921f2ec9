"""Chat batches: masks become -1 targets, packing keeps conversations whole, positions resume."""

from __future__ import annotations

import torch

from portachat.data.chat_data import synthetic_conversations
from portachat.data.chat_loader import ChatLoader, iter_chat_val_batches
from portachat.tokenizer import render_conversation


def test_padded_rows_hold_one_conversation_with_its_mask(small_tokenizer):
    convs = synthetic_conversations(6, seed=1)
    loader = ChatLoader(convs, small_tokenizer, batch_size=3, seq_len=200, pack=False, seed=0)
    batch = loader.next_batch()
    assert batch.inputs.shape == batch.targets.shape == (3, 200)
    for r in range(3):
        bos_positions = (batch.inputs[r] == small_tokenizer.bos_id).nonzero().flatten().tolist()
        ids, mask = None, None
        for conv in convs:  # find which conversation this row holds
            cand_ids, cand_mask = render_conversation(small_tokenizer, conv["messages"])
            if batch.inputs[r, : len(cand_ids)].tolist() == cand_ids[: 200]:
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
