"""The draft's reduced output head: which tokens it keeps, what it refuses, and the flag's checks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from portachat.device import get_device
from portachat.engine.loading import SpeculativeOptions, speculative_config
from portachat.engine.speculative.draft_vocab import kept_token_ids, trim_output_head
from portachat.quant import quantize_model


class Head(nn.Module):
    def __init__(self, vocab: int = 10, width: int = 4, tied: bool = True) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        if tied:
            self.lm_head.weight = self.embed.weight


def test_kept_ids_are_the_first_ones_plus_the_stop_tokens_sorted():
    assert kept_token_ids(10, 3, keep=(9, 1, 42)).tolist() == [0, 1, 2, 9]  # 42 is past the vocabulary
    with pytest.raises(ValueError, match="at least 1 token"):
        kept_token_ids(10, 0)


def test_trimmed_head_gives_the_kept_rows_logits_and_leaves_a_tied_embedding_whole():
    torch.manual_seed(0)
    model = Head()
    full = model.lm_head.weight.detach().clone()
    x = torch.randn(3, 4)
    expected = x @ full.T
    ids = trim_output_head(model, 4, keep=(8,))
    assert ids.tolist() == [0, 1, 2, 3, 8]
    torch.testing.assert_close(model.lm_head(x), expected[:, ids])
    assert model.embed.weight.shape == (10, 4)
    torch.testing.assert_close(model.embed.weight, full)
    assert trim_output_head(Head(), 10) is None  # the whole vocabulary: nothing to cut


def test_a_quantized_head_is_refused_by_name():
    from engine_testing import tiny_model

    model = tiny_model(64, seed=0)
    quantize_model(model, "int8", get_device("cpu"))
    if type(model.lm_head) is nn.Linear:
        pytest.skip("int8 quantization here keeps the output head in floating point")
    with pytest.raises(ValueError, match="plain output head"):
        trim_output_head(model, 8)


def test_prompt_lookup_with_a_draft_vocabulary_is_refused():
    with pytest.raises(ValueError, match="--speculative-draft-vocab"):
        speculative_config(SpeculativeOptions(model="ngram", draft_vocab_size=8), target=None, device="cpu")
