"""Preference pairs: TRL's three layouts read to the same pair, bad rows named by file and line, replies
(not prompts) supervised, chosen rows before rejected rows, and a loader that resumes where it stopped."""

from __future__ import annotations

import json

import pytest
import torch

from portachat.data.document_source import DataError
from portachat.data.preference_data import (
    PreferenceLoader,
    load_pairs,
    pair_rows,
    pairs_to_batch,
    row_to_pair,
    trainable,
)

USER = [{"role": "user", "content": "What is 2+3?"}]
GOOD = [{"role": "assistant", "content": "The answer is 5"}]
BAD = [{"role": "assistant", "content": "The answer is 6"}]


def test_the_three_trl_layouts_read_to_the_same_pair():
    standard = row_to_pair({"prompt": "What is 2+3?", "chosen": "The answer is 5", "rejected": "The answer is 6"})
    explicit = row_to_pair({"prompt": USER, "chosen": GOOD, "rejected": BAD, "answer": 5})
    implicit = row_to_pair({"chosen": USER + GOOD, "rejected": USER + BAD})
    for pair in (standard, explicit, implicit):
        assert (pair.prompt, pair.chosen, pair.rejected) == (USER, GOOD, BAD)
    assert explicit.answer == "5" and standard.answer is None


def test_bad_rows_are_named_by_file_and_line(tmp_path):
    path = tmp_path / "prefs.jsonl"
    rows = [{"prompt": "a", "chosen": "b", "rejected": "c"}, {"prompt": "a", "chosen": "b"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"prefs\.jsonl:2: .*'rejected'"):
        load_pairs([path])
    path.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n\n{oops\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"prefs\.jsonl:3: not valid JSON"):
        load_pairs([path])
    cases = [
        ({"prompt": USER + GOOD, "chosen": GOOD, "rejected": BAD}, "prompt ends with an assistant"),
        ({"prompt": USER, "chosen": USER, "rejected": BAD}, "'chosen' must end with an assistant"),
        ({"prompt": 3, "chosen": GOOD, "rejected": BAD}, "'prompt' must be a string"),
        ({"chosen": GOOD, "rejected": BAD}, "begin with the same prompt"),
        ({"prompt": USER, "chosen": [{"role": "assistant"}], "rejected": BAD}, "needs 'role' and 'content'"),
    ]
    for row, message in cases:
        with pytest.raises(DataError, match=message):
            row_to_pair(row, "x.jsonl:7")


def fake_render(messages, max_tokens):
    """One token per character of each message, a role token first; mask = assistant characters."""
    ids, mask = [], []
    for m in messages:
        body = [ord(c) for c in m["content"]]
        ids += [1] + body
        mask += [0] + [int(m["role"] == "assistant")] * len(body)
    return ids[:max_tokens], mask[:max_tokens]


def fake_prompt(messages):
    return fake_render(messages, None)[0] + [1]  # the generation prompt opens the assistant's turn


def test_only_the_reply_after_the_prompt_is_supervised():
    pair = row_to_pair({"prompt": [*USER, *GOOD, *USER], "chosen": GOOD, "rejected": BAD})  # an earlier reply
    (ids, mask), (rids, rmask) = pair_rows(pair, fake_render, fake_prompt, 200)
    prompt_len = len(fake_prompt(pair.prompt))
    assert ids[:prompt_len] == fake_prompt(pair.prompt)
    assert mask == [0] * prompt_len + [1] * (len(ids) - prompt_len)  # the earlier assistant turn is not trained
    assert rmask == [0] * prompt_len + [1] * (len(rids) - prompt_len)
    assert trainable(pair_rows(pair, fake_render, fake_prompt, 200))
    assert not trainable(pair_rows(pair, fake_render, fake_prompt, prompt_len))  # cut before any reply token


def test_a_batch_holds_chosen_rows_then_rejected_rows():
    pairs = [row_to_pair({"prompt": f"q{i}", "chosen": "yes" * (i + 1), "rejected": "no"}) for i in range(3)]
    rows = [pair_rows(p, fake_render, fake_prompt, 64) for p in pairs]
    batch = pairs_to_batch(rows, 0, 64, pair_index=[5, 6, 7], ref_logps=torch.arange(6.0))
    assert batch.inputs.shape[0] == 6 and batch.num_pairs == 3
    for i, ((cids, _cm), (rids, _rm)) in enumerate(rows):
        assert batch.inputs[i, : len(cids) - 1].tolist() == cids[:-1]
        assert batch.inputs[3 + i, : len(rids) - 1].tolist() == rids[:-1]
    counts = (batch.targets >= 0).sum(1).tolist()
    assert counts == [3, 6, 9, 2, 2, 2]  # the reply's characters: "yes" * (i + 1) and "no"
    moved = batch.to(torch.device("cpu"))
    assert moved.pair_index.tolist() == [5, 6, 7] and moved.ref_logps.tolist() == list(range(6))
    assert moved.supervised is not None


def test_loader_resumes_exactly_and_carries_reference_logps_in_order():
    pairs = [row_to_pair({"prompt": f"q{i}", "chosen": "a" * (i % 4 + 1), "rejected": "b"}) for i in range(10)]
    ref = torch.tensor([[float(i), -float(i)] for i in range(10)])
    loader = PreferenceLoader(pairs, fake_render, fake_prompt, 0, batch_size=3, seq_len=32, seed=1, ref_logps=ref)
    first = [loader.next_batch() for _ in range(2)]
    state = loader.state_dict()
    after = [loader.next_batch() for _ in range(4)]  # crosses an epoch boundary
    again = PreferenceLoader(pairs, fake_render, fake_prompt, 0, batch_size=3, seq_len=32, seed=1, ref_logps=ref)
    again.load_state_dict(state)
    for a, b in zip(after, [again.next_batch() for _ in range(4)], strict=True):
        assert torch.equal(a.inputs, b.inputs) and torch.equal(a.pair_index, b.pair_index)
    for batch in first + after:
        idx = batch.pair_index.float()
        assert batch.ref_logps.tolist() == torch.cat([idx, -idx]).tolist()
    seen = torch.cat([b.pair_index for b in first + after[:2]]).tolist()  # 4 batches of 3 = 1 epoch + 2
    assert sorted(seen[:10]) == list(range(10))
    other = PreferenceLoader(pairs, fake_render, fake_prompt, 0, 3, 32, stream=1, num_streams=2, seed=1)
    mine = PreferenceLoader(pairs, fake_render, fake_prompt, 0, 3, 32, stream=0, num_streams=2, seed=1)
    assert not set(mine.order(0)) & set(other.order(0))
