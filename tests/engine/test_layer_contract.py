"""Every forward of the engine against the one layer contract (portachat/model/layer_ops.py).

The model's own modules (ModuleLayerOps), the packed CPU products (PackedLayerOps) and the C decode
step (DecodeLayers, all layers in one call) each run a prefill and a few decode steps of a tiny fp32
model; at every step their logits equal the model's plain forward (model/gpt.py, the training
forward) over the whole sequence, with and without a LoRA adapter (against the adapter merged
into the weights)."""

from __future__ import annotations

import copy

import pytest
import torch
from engine_testing import make_engine, prompts_of, tiny_model

from portachat.engine import SamplingParams
from portachat.engine.module_ops import ModuleLayerOps
from portachat.engine.packed_forward import PackedLayerOps, PackedModel
from portachat.model.layer_ops import LayerOps, decoder_layer
from portachat.model.lora import load_lora, merge_into
from portachat.ops.cpu_kernels import library
from tests.lora_files import write_random_adapter

FAMILIES = {
    "qwen3": dict(),
    "qwen2-bias": dict(architecture="qwen2", qk_norm=False, attention_bias=True),
    "llama": dict(architecture="llama", qk_norm=False),
}
DECODE_STEPS = 4


def _engine(chat_tokenizer, model, path: str):
    """An engine whose every step runs `path`: "modules", "packed" (PyTorch over the fused products)
    or "kernels" (the C decode step where a step qualifies)."""
    engine = make_engine(chat_tokenizer, model=model, dtype="fp32")
    if path == "modules":
        engine.runner.packed = None
    elif path == "packed":
        assert engine.runner.packed is not None, "no packed CPU forward in this torch build"
        engine.runner.packed.decode_rows = 0
    return engine


def _step_logits(engine, prompt: list[int], adapter: str | None = None) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy tokens and each step's logits [V] for one sequence (the prefill's, then each decode's)."""
    forward = engine.runner.forward
    logits: list[torch.Tensor] = []
    engine.runner.forward = lambda inp: logits.append(out := forward(inp)) or out
    params = SamplingParams(max_tokens=DECODE_STEPS + 1, temperature=0.0, ignore_eos=True, adapter=adapter)
    try:
        [out] = engine.generate([prompt], params)
    finally:
        engine.runner.forward = forward
    return out.token_ids, [row[0].clone() for row in logits]


@torch.inference_mode()
def _reference(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """The plain forward's logits [steps, V] at each position the engine sampled from."""
    ids = torch.tensor([prompt + tokens[:-1]])
    return model(ids)[0, len(prompt) - 1 :].float()


def _check(engine, reference_model, prompt, adapter=None) -> None:
    tokens, logits = _step_logits(engine, prompt, adapter)
    assert len(logits) == DECODE_STEPS + 1  # the prefill, then one step per decode token
    expected = _reference(reference_model, prompt, tokens)
    got = torch.stack(logits)
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4), (got - expected).abs().max()


def _paths(family: str) -> list[str]:
    kernels = library() is not None and not FAMILIES[family].get("qk_norm", True)  # QK-norm: no C step
    return ["modules", "packed"] + (["kernels"] if kernels else [])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_path_equals_the_plain_forward_at_prefill_and_decode(chat_tokenizer, family, monkeypatch):
    model = tiny_model(chat_tokenizer.vocab_size, seed=5, **FAMILIES[family]).requires_grad_(False)
    prompt = prompts_of([7], chat_tokenizer.vocab_size, seed=3)[0]
    on_kernels = []
    decode = PackedModel.forward_decode
    monkeypatch.setattr(PackedModel, "forward_decode", lambda self, *a: on_kernels.append(1) or decode(self, *a))
    for path in _paths(family):
        on_kernels.clear()
        _check(_engine(chat_tokenizer, model, path), model, prompt)
        # the C step runs the short prefill and every decode step; the other paths never
        assert len(on_kernels) == (DECODE_STEPS + 1 if path == "kernels" else 0), path


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_lora_joins_every_path_as_merged_weights_do(tmp_path, chat_tokenizer, family):
    """An adapter on all seven products: modules and packed paths equal the merged model (the C step
    runs base-model rows only, so an adapter step takes the packed path)."""
    model = tiny_model(chat_tokenizer.vocab_size, seed=6, **FAMILIES[family]).requires_grad_(False)
    path = write_random_adapter(tmp_path / "a", model, rank=4, alpha=8, seed=1)
    merged = merge_into(copy.deepcopy(model), load_lora(path))
    prompt = prompts_of([6], chat_tokenizer.vocab_size, seed=4)[0]
    for kind in _paths(family):
        engine = _engine(chat_tokenizer, model, kind)
        engine.add_adapter("a", path)
        _check(engine, merged, prompt, adapter="a")
        _check(engine, model, prompt)  # the base model's rows stay the base model's


class _Recorder:
    """LayerOps that records the order decoder_layer calls its steps in (shapes only, no model)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name):
        def step(*args):
            self.calls.append(name)
            if name == "rope":
                return torch.zeros(1, 1, 2), torch.zeros(1, 1, 2), torch.zeros(1, 1, 2)
            return torch.zeros(1, 2)
        return step


def test_decoder_layer_runs_the_contract_in_order_and_asks_adapter_inputs_only_when_needed():
    ops = _Recorder()
    decoder_layer(ops, 0, torch.zeros(1, 2))
    assert ops.calls == ["qkv", "rope", "attend", "o", "gate_up", "swiglu", "down"]
    assert all(hasattr(LayerOps, name) for name in ops.calls + ["qkv_input", "gate_up_input"])
    for impl in (ModuleLayerOps, PackedLayerOps):  # both implement every step of the contract
        assert all(callable(getattr(impl, name, None)) for name in ops.calls + ["qkv_input", "gate_up_input"])
