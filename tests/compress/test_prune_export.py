"""A pruned checkpoint of ours exports as any other: `export gguf` writes llama.cpp's format and
transformers' GGUF loader computes our logits from it (fp32)."""

from __future__ import annotations

import pytest
import torch

from portachat.compress.prune import PruneTargets
from portachat.compress.prune_run import PruneOptions, run_prune
from portachat.device import get_device
from portachat.export import export_gguf
from portachat.model.load import load_for_inference
from tests.export.export_testing import make_checkpoint

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")


@pytest.mark.parametrize("arch, overrides, targets", [
    ("qwen3", {}, PruneTargets(num_layers=2, ffn_hidden_size=128, hidden_size=192)),
    ("llama", dict(architecture="llama", qk_norm=False), PruneTargets(num_layers=2, ffn_hidden_size=128, hidden_size=192)),
])  # fmt: skip
def test_pruned_checkpoint_exports_to_gguf_with_our_logits(tmp_path, small_tokenizer, shakespeare_path, arch,
                                                           overrides, targets):
    src, _model = make_checkpoint(tmp_path / "src", small_tokenizer, n_layer=3, **overrides)
    run_prune(PruneOptions(model=str(src), output=str(tmp_path / "pruned"), targets=targets, data=str(shakespeare_path),
                           calibration_samples=4, seq_len=32, depth_metric="cosine"),
              dev=get_device("cpu"), print_fn=lambda _m: None)
    result = export_gguf(tmp_path / "pruned", tmp_path / "m.gguf", type_="f32")
    assert result.architecture == arch
    ids = torch.tensor([small_tokenizer.encode("ROMEO: But soft, what light through yonder window breaks?")])
    ours = load_for_inference(tmp_path / "pruned", device="cpu", dtype=torch.float32)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="m.gguf", dtype=torch.float32)
    assert hf.config.num_hidden_layers == 2
    with torch.no_grad():
        assert (ours.model(ids) - hf.eval()(ids).logits).abs().max() < 1e-3
