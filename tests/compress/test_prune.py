"""Depth and width pruning of our GPT and of Llama / Qwen2 / Qwen3 directories: the written
checkpoint loads in transformers as its family, and its fp32 logits equal our forward's on the same
pruned weights. Impossible targets are refused before any work."""

from __future__ import annotations

import json

import pytest
import torch

from portachat.cli import main
from portachat.compress.importance import measure_importance
from portachat.compress.prune import PruneError, PruneTargets, prune_model, pruned_config
from portachat.compress.prune_run import PruneOptions, run_prune
from portachat.device import get_device
from portachat.model import GPT
from portachat.model.load import load_for_inference
from tests.export.export_testing import make_checkpoint
from tests.model.gpt_testing import randomized, tiny_config
from tests.model.hf_families import make_hf_dir, train_bpe

transformers = pytest.importorskip("transformers")

TARGETS = PruneTargets(num_layers=2, ffn_hidden_size=64, num_attention_heads=2, hidden_size=48)
CASES = {
    "llama (tied)": ("llama", {"tie_word_embeddings": True}, TARGETS),
    "qwen2 (biases)": ("qwen2", {}, TARGETS),
    "qwen3 (qk-norm, head_dim 24, one KV group kept)": (
        "qwen3", {"head_dim": 24}, PruneTargets(num_layers=2, num_query_groups=1, num_attention_heads=2, hidden_size=40)),
}


def _hf_logits(directory, idx: torch.Tensor) -> torch.Tensor:
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(idx).logits


def _our_logits(directory, idx: torch.Tensor) -> torch.Tensor:
    loaded = load_for_inference(directory, device="cpu", dtype=torch.float32)
    with torch.no_grad():
        return loaded.model(idx)


def _prune(source, output, targets, data) -> None:
    run_prune(PruneOptions(model=str(source), output=str(output), targets=targets, data=str(data),
                           calibration_samples=8, seq_len=32), dev=get_device("cpu"), print_fn=lambda _m: None)


@pytest.mark.parametrize("case", list(CASES))
def test_pruned_hf_family_loads_in_transformers_with_our_logits(case, tmp_path, shakespeare_path):
    family, overrides, targets = CASES[case]
    make_hf_dir(tmp_path / "src", family, tokenizer=train_bpe(), num_hidden_layers=3, **overrides)
    _prune(tmp_path / "src", tmp_path / "out", targets, shakespeare_path)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == family and config["num_hidden_layers"] == 2
    assert config["hidden_size"] == targets.hidden_size
    assert config["num_attention_heads"] == targets.num_attention_heads
    assert config["num_key_value_heads"] == (targets.num_query_groups or 2)
    assert config["intermediate_size"] == (targets.ffn_hidden_size or 96)
    assert config["head_dim"] == overrides.get("head_dim", 16)
    assert config["tie_word_embeddings"] == overrides.get("tie_word_embeddings", False)
    idx = torch.randint(0, 320, (2, 24), generator=torch.Generator().manual_seed(0))
    ours, theirs = _our_logits(tmp_path / "out", idx), _hf_logits(tmp_path / "out", idx)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_pruned_own_checkpoint_loads_as_qwen3_with_our_logits(tmp_path, small_tokenizer, shakespeare_path):
    src, _model = make_checkpoint(tmp_path / "src", small_tokenizer, n_layer=3, n_embd=64, n_head=4, n_kv_head=2,
                                  head_dim=16, intermediate_size=96)
    _prune(src, tmp_path / "out", PruneTargets(num_layers=2, ffn_hidden_size=48, num_query_groups=1, hidden_size=32),
           shakespeare_path)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"]) == ("qwen3", 2, 32)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["intermediate_size"]) == (2, 1, 48)
    meta = json.loads((tmp_path / "out" / "portachat.json").read_text())
    assert len(meta["pruning"]["kept_layers"]) == 2 and meta["pruned_from"] == str(src)
    idx = torch.randint(0, 384, (2, 24), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(_our_logits(tmp_path / "out", idx), _hf_logits(tmp_path / "out", idx),
                               atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("targets, message", [
    (PruneTargets(num_layers=5), "--target-num-layers 5 is larger than the model's 2"),
    (PruneTargets(hidden_size=0), "--target-hidden-size must be a positive integer"),
    (PruneTargets(num_attention_heads=3), "does not divide into 2 KV groups"),
    (PruneTargets(num_attention_heads=4, num_query_groups=1), "needs 4 heads per group"),
    (PruneTargets(ffn_hidden_size=1000), "--target-ffn-hidden-size 1000 is larger"),
])  # fmt: skip
def test_impossible_targets_are_refused(targets, message):
    with pytest.raises(PruneError, match=message):
        pruned_config(tiny_config(), targets)


def test_bad_target_is_refused_before_calibration_or_writing(tmp_path):
    make_hf_dir(tmp_path / "src", "llama", tokenizer=train_bpe())
    with pytest.raises(PruneError, match="larger than the model"):
        # the data does not exist: a refusal that read it would fail with another error
        _prune(tmp_path / "src", tmp_path / "out", PruneTargets(num_layers=9), tmp_path / "missing.txt")
    assert not (tmp_path / "out").exists()


def test_structured_pruning_needs_calibration_data(tmp_path):
    with pytest.raises(PruneError, match="--data"):
        run_prune(PruneOptions(model="unused", output=str(tmp_path / "out"), targets=PruneTargets(num_layers=1)))


def test_pruning_what_does_nothing_leaves_the_logits_unchanged():
    """An identity block, a neuron that never fires and a KV group with zero values pruned away:
    the smaller model computes exactly what the original did (the slicing keeps every index right)."""
    model = randomized(GPT(tiny_config(n_layer=3, qk_norm=False, attention_bias=True, architecture="qwen2")))
    model.requires_grad_(False)
    model.model.layers[1].self_attn.o_proj.weight.zero_()
    model.model.layers[1].mlp.down_proj.weight.zero_()
    for block in model.model.layers:
        block.mlp.gate_proj.weight[3].zero_()
        block.self_attn.v_proj.weight[:16].zero_()  # KV group 0 (query heads 0 and 1) adds nothing
        block.self_attn.v_proj.bias[:16].zero_()
    idx = torch.randint(0, 128, (4, 17), generator=torch.Generator().manual_seed(0))
    importance = measure_importance(model, list(idx.split(2)), depth_metric="cosine")
    pruned, plan = prune_model(model, importance, PruneTargets(num_layers=2, ffn_hidden_size=159, num_query_groups=1))
    assert plan.layers == [0, 2] and all(g == [1] for g in plan.groups.values())
    assert all(3 not in n for n in plan.neurons.values()) and pruned.config.n_head == 2
    with torch.no_grad():
        torch.testing.assert_close(pruned(idx), model(idx), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("flags, message", [
    ([], "nothing to prune"),
    (["--target-num-layers", "1"], "pass --data FILE"),
    (["--unstructured", "0.2", "--sparsity-pattern", "2:4"], "two different patterns"),
])  # fmt: skip
def test_prune_command_refuses_bad_flags_with_exit_1_and_writes_nothing(tmp_path, capsys, flags, message):
    code = main(["prune", "--model", str(tmp_path / "unread"), "--output", str(tmp_path / "out"), *flags])
    assert code == 1 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
