"""`portachat prune` on a real model: SmolLM2-135M-Instruct (GGUF) to 24 of its 30 blocks. The
directory loads in transformers as a Llama, and transformers' fp32 logits equal ours."""

from __future__ import annotations

import json

import pytest
import torch

from portachat.cli import main
from portachat.model.load import load_for_inference
from tests.smollm2 import smollm2_gguf_path

pytestmark = pytest.mark.slow
transformers = pytest.importorskip("transformers")


def test_prune_smollm2_gguf_to_fewer_layers_loads_in_transformers(tmp_path, shakespeare_path, capsys):
    out = tmp_path / "smol-24"
    code = main(["prune", "--model", str(smollm2_gguf_path()), "--output", str(out), "--data", str(shakespeare_path),
                 "--target-num-layers", "24", "--depth-metric", "cosine", "--calibration-samples", "4",
                 "--seq-len", "64", "--device", "cpu"])
    assert code == 0 and "-> " in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"]) == ("llama", 24, 576)
    kept = json.loads((out / "portachat.json").read_text())["pruning"]["kept_layers"]
    assert len(kept) == 24 and kept == sorted(kept) and 0 in kept  # the first block always matters most
    ours = load_for_inference(out, device="cpu", dtype=torch.float32)
    ids = torch.tensor([ours.tokenizer.encode("The king said to his daughter that")])
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(ours.model(ids), hf(ids).logits, atol=2e-4, rtol=2e-4)
