"""Magnitude sparsity is exact: torch.nn.utils.prune's count of zeros per matrix (round(amount * n)),
the smallest |w| zeroed, 2:4 keeps two of every four; the report counts the zeros really there."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from portachat.compress.prune_run import PruneOptions, run_prune
from portachat.compress.unstructured import block_linears, sparsify_
from portachat.device import get_device
from portachat.model import GPT
from tests.model.gpt_testing import randomized, tiny_config
from tests.model.hf_families import make_hf_dir, train_bpe


def _model() -> GPT:
    model = randomized(GPT(tiny_config()))
    model.requires_grad_(False)
    return model


def test_unstructured_sparsity_is_exact_and_zeroes_the_smallest_weights():
    model = _model()
    before = {name: m.weight.clone() for name, m in block_linears(model)}
    embed = model.model.embed_tokens.weight.clone()
    report = sparsify_(model, 0.2)
    expected = 0
    for name, linear in block_linears(model):
        w, old = linear.weight, before[name]
        n_zero = round(0.2 * w.numel())
        assert int((w == 0).sum()) == n_zero
        expected += n_zero
        kept = old[w != 0].abs()
        assert float(old[w == 0].abs().max()) <= float(kept.min())  # the smallest magnitudes went
        assert torch.equal(w[w != 0], old[w != 0])  # the rest untouched
        assert not hasattr(linear, "weight_orig") and not linear._forward_pre_hooks  # permanent
    assert report.zeros == expected and report.total == sum(w.numel() for w in before.values())
    assert report.sparsity == pytest.approx(expected / report.total)
    assert torch.equal(model.model.embed_tokens.weight, embed)  # embeddings and head stay dense
    all_params = list({id(p): p for p in model.parameters()}.values())
    assert report.model_zeros == sum(int((p == 0).sum()) for p in all_params)
    assert "Dense kernels do not run faster" in report.summary()


def test_two_four_keeps_two_of_every_four():
    model = _model()
    report = sparsify_(model, pattern="2:4")
    for _name, linear in block_linears(model):
        groups = linear.weight.reshape(linear.weight.size(0), -1, 4)
        assert bool(((groups != 0).sum(-1) == 2).all())
    assert report.sparsity == 0.5


@pytest.mark.parametrize("amount", [0.0, 1.0, -0.1, 1.5])
def test_fraction_outside_zero_one_is_refused(amount):
    with pytest.raises(ValueError, match="between 0 and 1"):
        sparsify_(_model(), amount)


def test_prune_unstructured_writes_the_exact_zeros_without_calibration_data(tmp_path):
    """`portachat prune --unstructured 0.2` needs no --data; the written weights hold exactly the zeros reported."""
    make_hf_dir(tmp_path / "src", "qwen2", tokenizer=train_bpe())
    result = run_prune(PruneOptions(model=str(tmp_path / "src"), output=str(tmp_path / "out"), unstructured=0.2),
                       dev=get_device("cpu"), print_fn=lambda _m: None)
    state = load_file(str(tmp_path / "out" / "model.safetensors"))
    matrices = {k: v for k, v in state.items() if ".layers." in k and k.endswith("proj.weight")}
    assert result.sparsity is not None and result.plan is None
    assert sum(int((v == 0).sum()) for v in matrices.values()) == result.sparsity.zeros
    assert all(int((v == 0).sum()) == round(0.2 * v.numel()) for v in matrices.values())
    assert result.params_after == result.params_before  # zeros are still parameters
