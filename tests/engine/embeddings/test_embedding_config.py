"""Pooling configs read from sentence-transformers files, and which directories count as embedding models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from portachat.engine.embeddings import is_embedding_model, read_pooling_config
from portachat.engine.embeddings.pooling import pool
from portachat.storage.atomic import CheckpointError
from tests.minilm import minilm_dir


def _write(directory: Path, name: str, data) -> None:
    (directory / name).parent.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(json.dumps(data))


def test_minilm_pools_by_mean_normalises_and_stops_at_256_tokens():
    config = read_pooling_config(minilm_dir())
    assert (config.pooling, config.normalize, config.max_tokens, config.matryoshka) == ("mean", True, 256, None)
    assert is_embedding_model(minilm_dir())


def test_detection_sentence_transformers_files_or_bert_architecture(tmp_path):
    chat = tmp_path / "chat"
    _write(chat, "config.json", {"model_type": "llama", "architectures": ["LlamaForCausalLM"]})
    assert not is_embedding_model(chat)
    bert = tmp_path / "bert"
    _write(bert, "config.json", {"model_type": "bert", "architectures": ["BertModel"]})
    assert is_embedding_model(bert)
    qwen = tmp_path / "qwen-embedding"  # a decoder with a Pooling module: an embedding model
    _write(qwen, "config.json", {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]})
    _write(qwen, "modules.json", [{"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"},
                                  {"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}])
    _write(qwen, "1_Pooling/config.json", {"pooling_mode_lasttoken": True, "pooling_mode_mean_tokens": False})
    assert is_embedding_model(qwen)
    config = read_pooling_config(qwen)
    assert (config.pooling, config.normalize) == ("last", False)  # no Normalize module
    assert read_pooling_config(chat).pooling == "mean" and read_pooling_config(chat).normalize
    assert not is_embedding_model(tmp_path / "nowhere")


def test_matryoshka_sizes_come_from_config_json(tmp_path):
    _write(tmp_path, "config.json", {"model_type": "bert", "matryoshka_dimensions": [256, 64, 128]})
    assert read_pooling_config(tmp_path).matryoshka == (64, 128, 256)
    _write(tmp_path, "config.json", {"model_type": "bert", "is_matryoshka": True})
    assert read_pooling_config(tmp_path).matryoshka == ()


def test_unsupported_sentence_transformers_setups_are_refused_by_name(tmp_path):
    _write(tmp_path, "config.json", {"model_type": "bert"})
    _write(tmp_path, "modules.json", [{"path": "", "type": "sentence_transformers.models.Transformer"},
                                      {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                                      {"path": "2_Dense", "type": "sentence_transformers.models.Dense"}])
    _write(tmp_path, "1_Pooling/config.json", {"pooling_mode_mean_tokens": True})
    with pytest.raises(CheckpointError, match="models.Dense"):
        read_pooling_config(tmp_path)
    _write(tmp_path, "modules.json", [{"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}])
    _write(tmp_path, "1_Pooling/config.json", {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True})
    with pytest.raises(CheckpointError, match="combined pooling modes"):
        read_pooling_config(tmp_path)
    with pytest.raises(ValueError, match="pooling 'median'"):
        read_pooling_config(tmp_path.parent).with_pooling("median")


def test_pooling_modes_ignore_padding():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 6.0], [100.0, 100.0]],
                           [[-1.0, 5.0], [7.0, -3.0], [2.0, 2.0]]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    torch.testing.assert_close(pool(hidden, mask, "mean"), torch.tensor([[2.0, 4.0], [8 / 3, 4 / 3]]))
    torch.testing.assert_close(pool(hidden, mask, "cls"), torch.tensor([[1.0, 2.0], [-1.0, 5.0]]))
    torch.testing.assert_close(pool(hidden, mask, "last"), torch.tensor([[3.0, 6.0], [2.0, 2.0]]))
    torch.testing.assert_close(pool(hidden, mask, "max"), torch.tensor([[3.0, 6.0], [7.0, 5.0]]))
    torch.testing.assert_close(pool(hidden, mask, "mean_sqrt_len"),
                               torch.tensor([[4.0, 8.0], [8.0, 4.0]]) / torch.tensor([[2.0], [3.0]]).sqrt())
