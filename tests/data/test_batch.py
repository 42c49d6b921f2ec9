"""The training micro-batch: what it knows of its rows, and the supervised positions found on the host."""

from __future__ import annotations

import torch

from portachat.data.batch import Batch, as_batch


def test_a_batch_counts_real_tokens_and_finds_its_supervised_positions_on_the_host():
    inputs = torch.arange(12).view(2, 6)
    targets = torch.tensor([[-1, 5, 6, -1, -1, -1], [-1, -1, 3, 4, 5, -1]])
    batch = Batch(inputs, targets, lengths=(3, 5))
    assert batch.num_real() == 8 and batch.attention_pairs() == 9 + 25 and batch.num_supervised() == 5
    moved = batch.to(torch.device("cpu"))
    assert moved.supervised.tolist() == [1, 2, 8, 9, 10] and moved.lengths == (3, 5)
    plain = as_batch((inputs, targets))
    assert plain.num_real() == 12 and plain.attention_pairs() == 2 * 36  # no lengths: every position, whole rows
