"""The BERT encoder: HF BertModel's hidden states (fp32) from the same weights, and all-MiniLM-L6-v2's
sentence embeddings equal to sentence-transformers' within 1e-5."""

from __future__ import annotations

import pytest
import torch

from portachat.device import get_device
from portachat.model.bert import BertConfig, build_bert
from portachat.storage.atomic import CheckpointError
from tests.minilm import minilm_dir

TINY = {"model_type": "bert", "architectures": ["BertModel"], "vocab_size": 97, "hidden_size": 32,
        "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64, "max_position_embeddings": 40,
        "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu", "pad_token_id": 0}


def test_hidden_states_match_transformers_bert_model_with_padding():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    reference = transformers.BertModel(transformers.BertConfig(**TINY, attn_implementation="eager")).eval()
    ours = build_bert(TINY, reference.state_dict())
    ids = torch.randint(1, 97, (3, 11))
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[1, 7:] = 0
    mask[2, 3:] = 0
    ids[mask == 0] = 0
    with torch.no_grad():
        want = reference(input_ids=ids, attention_mask=mask).last_hidden_state
        got = ours(ids, mask)
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)


def test_a_padded_input_equals_the_same_input_alone():
    torch.manual_seed(1)
    from portachat.model.bert import BertEncoder

    model = build_bert(TINY, BertEncoder(BertConfig.from_hf(TINY)).state_dict())
    ids = torch.randint(1, 97, (1, 6))
    alone = model(ids, torch.ones(1, 6, dtype=torch.long))
    padded = model(torch.cat([ids, torch.zeros(1, 4, dtype=torch.long)], 1),
                   torch.tensor([[1] * 6 + [0] * 4]))
    torch.testing.assert_close(padded[:, :6], alone, atol=1e-6, rtol=1e-6)


def test_config_and_weight_errors_name_the_problem():
    with pytest.raises(CheckpointError, match="model_type 'roberta' is not a BERT encoder"):
        BertConfig.from_hf({**TINY, "model_type": "roberta"})
    with pytest.raises(CheckpointError, match="position_embedding_type 'relative_key'"):
        BertConfig.from_hf({**TINY, "position_embedding_type": "relative_key"})
    with pytest.raises(CheckpointError, match="missing 'hidden_size'"):
        BertConfig.from_hf({k: v for k, v in TINY.items() if k != "hidden_size"})
    from portachat.model.bert import BertEncoder

    state = BertEncoder(BertConfig.from_hf(TINY)).state_dict()
    with pytest.raises(CheckpointError, match="missing \\['encoder.layer.1.output.dense.bias'\\]"):
        build_bert(TINY, {k: v for k, v in state.items() if k != "encoder.layer.1.output.dense.bias"})
    wrong = {**state, "embeddings.word_embeddings.weight": torch.zeros(96, 32)}
    with pytest.raises(CheckpointError, match="embeddings.word_embeddings.weight has shape \\(96, 32\\)"):
        build_bert(TINY, wrong)
    prefixed = {f"bert.{k}": v for k, v in state.items()}  # BertForMaskedLM's names load too
    assert build_bert(TINY, prefixed).config.hidden_size == 32


def test_minilm_sentence_embeddings_match_sentence_transformers_fp32():
    st = pytest.importorskip("sentence_transformers")
    from portachat.engine.embeddings import load_embedding_model

    directory = minilm_dir()
    texts = ["Hello world", "The quick brown fox jumps over the lazy dog. " * 4, "", "中文句子和 émigré naïve café",
             "a " * 400]  # the last one is truncated to 256 tokens by both
    ours = load_embedding_model(directory, get_device("cpu"), "fp32").embed_texts(texts)
    reference = st.SentenceTransformer(str(directory), device="cpu").encode(texts, convert_to_tensor=True)
    assert ours.shape == (5, 384) and ours.dtype == torch.float32
    torch.testing.assert_close(ours, reference.float(), atol=1e-5, rtol=0)
    cosine = torch.nn.functional.cosine_similarity(ours, reference.float())
    assert (cosine > 1 - 1e-5).all()
