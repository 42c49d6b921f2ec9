"""Requests waiting together are embedded together, and each gets exactly its own rows."""

from __future__ import annotations

import pytest
import torch

from portachat.device import get_device
from portachat.engine.embeddings import EmbeddingInputError, load_embedding_model
from portachat.engine.embeddings.queue import EmbeddingQueue
from tests.minilm import minilm_dir


@pytest.fixture(scope="module")
def minilm():
    return load_embedding_model(minilm_dir(), get_device("cpu"), "fp32")


def test_waiting_requests_share_one_forward_per_dimensions_value(minilm):
    q = EmbeddingQueue(minilm, start=False)
    texts = [["one text"], ["two", "texts here"], ["a third request, somewhat longer than the others"]]
    futures = [q.submit([minilm.tokenize(t) for t in group]) for group in texts]
    full = q.submit([minilm.tokenize("same dims, asked explicitly")], dimensions=384)
    q.start()
    for group, future in zip(texts, futures, strict=True):
        torch.testing.assert_close(future.result(timeout=60), minilm.embed_texts(group), atol=1e-5, rtol=0)
    assert full.result(timeout=60).shape == (1, 384)
    assert q.batches_run == 2  # {None, 384}: one forward pass each, not four
    q.close()
    q._thread.join(10)
    assert not q._thread.is_alive()


def test_a_failure_reaches_every_request_of_its_batch(minilm):
    q = EmbeddingQueue(minilm, start=False)
    good = q.submit([minilm.tokenize("fine")])
    bad = q.submit([minilm.tokenize("word " * 300)])  # unchecked: 302 tokens
    q.start()
    for future in (good, bad):
        with pytest.raises(EmbeddingInputError, match="maximum input length is 256"):
            future.result(timeout=60)
    later = q.submit([minilm.tokenize("fine")])  # the worker keeps going
    torch.testing.assert_close(later.result(timeout=60), minilm.embed_texts(["fine"]))
    q.close()
