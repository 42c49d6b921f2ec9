from __future__ import annotations

import pytest
import torch

from portachat.device import get_device
from portachat.engine.traffic import decode_read_bytes
from portachat.model import GPT, GPTConfig
from portachat.ops.kv_quant import bytes_per_token
from portachat.quant import quantize_model


def _model(tied: bool) -> GPT:
    cfg = GPTConfig(vocab_size=512, n_layer=2, n_embd=64, n_head=2, n_kv_head=1, head_dim=32,
                    intermediate_size=128, max_seq_len=64, tie_embeddings=tied)
    torch.manual_seed(0)
    return GPT(cfg)


def test_an_untied_table_is_read_one_row_per_sequence():
    untied, tied = _model(False), _model(True)
    row = 64 * 4
    table = 512 * row
    kv = bytes_per_token(2, 1, 32, torch.float32)
    assert decode_read_bytes(untied, 1, 0, torch.float32) == untied.num_params() * 4 - table + row
    assert decode_read_bytes(untied, 3, 10, torch.float32) == untied.num_params() * 4 - table + 3 * row + 30 * kv
    assert decode_read_bytes(tied, 3, 10, torch.float32) == tied.num_params() * 4 + 30 * kv  # the head reads it all


def test_quantized_weights_count_as_stored():
    model = _model(False).to(torch.bfloat16)
    before = decode_read_bytes(model, 1, 0, torch.bfloat16)
    quantize_model(model, "int8", get_device("cpu"))
    after = decode_read_bytes(model, 1, 0, torch.bfloat16)
    assert after < 0.7 * before  # int8 codes (+ scales) instead of bf16
    assert decode_read_bytes(model, 1, 8, torch.int8) < decode_read_bytes(model, 1, 8, torch.bfloat16)


@pytest.mark.parametrize("batch", [1, 4])
def test_bytes_grow_with_context(batch):
    model = _model(False)
    assert decode_read_bytes(model, batch, 20, torch.float32) > decode_read_bytes(model, batch, 10, torch.float32)
