"""Weight-only int8/int4: kernels match the dequantized weights, memory shrinks, quality holds."""

from __future__ import annotations

import importlib.abc
import importlib.util
import math
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from portachat.device.probe import ProbeResult
from portachat.device.quantization import BACKEND_ATEN_CPU, BACKEND_TORCHAO, QuantPlan, decide_quantization
from portachat.model import GPT, GPTConfig
from portachat.quant import (
    Int4Linear,
    Int8Embedding,
    Int8Linear,
    QuantizationError,
    dequantize_int4,
    dequantize_int8,
    quantize_int4,
    quantize_int8,
    quantize_model,
    weight_bytes,
)

CPU = ProbeResult(kind="cpu", device_type="cpu", names=["cpu"])


def cpu_plan(mode: str) -> QuantPlan:
    return decide_quantization(CPU, mode, cpu_capability="AVX512")


def tiny_gpt(tied: bool = False, seed: int = 0) -> GPT:
    cfg = GPTConfig(
        vocab_size=384,
        n_layer=2,
        n_embd=128,
        n_head=4,
        n_kv_head=2,
        head_dim=32,
        intermediate_size=320,
        max_seq_len=128,
        tie_embeddings=tied,
    )
    model = GPT(cfg)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # random everywhere (init zeroes some projections), scaled like a trained net
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=generator) / math.sqrt(p.shape[1]))
    return model.eval()


def test_int8_codes_are_within_half_a_step():
    w = torch.randn(96, 64)
    codes, scale = quantize_int8(w)
    assert codes.dtype == torch.int8 and scale.dtype == torch.bfloat16
    err = (dequantize_int8(codes, scale) - w).abs()
    assert (err <= scale.float()[:, None] / 2 + 1e-6).all()


def test_int4_codes_are_within_half_a_step():
    w = torch.randn(32, 128)
    codes, scale, zero = quantize_int4(w, 32)
    assert codes.min() >= 0 and codes.max() <= 15
    err = (dequantize_int4(codes, scale, zero, 32) - w).view(32, 4, 32).abs()
    assert (err <= scale.float().unsqueeze(-1) / 2 + 1e-3).all()


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_quantized_linear_matches_its_dequantized_weight(kind, bias):
    torch.manual_seed(0)
    linear = nn.Linear(128, 96, bias=bias)
    if kind == "int8":
        q = Int8Linear.from_linear(linear)
        w = q.dequantized_weight()
    else:
        q = Int4Linear.from_linear(linear, group_size=32)
        w = dequantize_int4(*quantize_int4(linear.weight, 32), 32)
    x = torch.randn(3, 5, 128)
    y = q(x)
    # The kernels take bf16 activations; the reference does the same rounding, then exact math.
    ref = F.linear(x.bfloat16().float(), w, linear.bias)
    assert y.shape == (3, 5, 96) and y.dtype == torch.float32
    assert (y - ref).abs().max() <= 0.01 * ref.abs().max()
    # ... and the weight itself is close to the original
    assert (w - linear.weight).abs().max() <= (0.01 if kind == "int8" else 0.1) * linear.weight.abs().max()


def test_int8_embedding_looks_up_dequantized_rows_and_follows_model_dtype():
    emb = nn.Embedding(50, 32)
    q = Int8Embedding.from_embedding(emb)
    idx = torch.tensor([[0, 7, 49]])
    codes, scale = quantize_int8(emb.weight)
    torch.testing.assert_close(q(idx), dequantize_int8(codes, scale)[idx])
    assert q(idx).dtype == torch.float32
    assert q.to(torch.bfloat16)(idx).dtype == torch.bfloat16


@pytest.mark.parametrize("tied", [False, True])
def test_memory_shrinks_vs_bf16(tied):
    model = tiny_gpt(tied)
    bf16_bytes = weight_bytes(model) // 2  # fp32 model: bf16 is half
    report8 = quantize_model(model, "int8", plan=cpu_plan("int8"))
    assert report8.bytes_after == weight_bytes(model) and not report8.skipped
    assert bf16_bytes / report8.bytes_after >= 1.9
    assert isinstance(model.lm_head, Int8Linear) and isinstance(model.model.embed_tokens, Int8Embedding)
    if tied:  # one int8 table serves the lookup and the output head
        assert model.lm_head.qweight is model.model.embed_tokens.qweight
    model4 = tiny_gpt(tied)
    report4 = quantize_model(model4, "int4", plan=cpu_plan("int4"))
    assert not report4.skipped and isinstance(model4.model.layers[0].mlp.down_proj, Int4Linear)
    assert report4.bytes_after < report8.bytes_after
    assert "int4" in report4.summary() and "smaller" in report4.summary()


def test_quantized_model_decodes_through_the_engine_as_its_full_forward():
    from portachat.engine import SamplingParams
    from portachat.engine.oneshot import generate_once

    model = tiny_gpt(seed=1)
    idx = torch.randint(0, 384, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ref = model(idx)
        quantize_model(model, "int8", plan=cpu_plan("int8"))
        full = model(idx)
    assert (ref.softmax(-1) - full.softmax(-1)).abs().max() < 0.02
    # The engine's paged KV cache, prefill then decode, over the quantized modules: each chosen token and
    # its log-probability are what one full forward over prompt + reply gives.
    prompts = idx[:, :20].tolist()
    replies = generate_once(model, prompts, SamplingParams(max_tokens=4, temperature=0.0, logprobs=True))
    for prompt, reply in zip(prompts, replies, strict=True):
        with torch.inference_mode():
            logp = model(torch.tensor([prompt + reply.token_ids]))[0, len(prompt) - 1 : -1].log_softmax(-1)
        assert reply.token_ids == logp.argmax(-1).tolist()
        chosen = logp.gather(1, torch.tensor(reply.token_ids)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(reply.logprobs), chosen, atol=2e-3, rtol=0)


def test_torchao_backend_runs_int8_weight_only():
    model = tiny_gpt(seed=2)
    idx = torch.randint(0, 384, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ref = model(idx).softmax(-1)
        plan = QuantPlan("int8", BACKEND_TORCHAO, torch.bfloat16, None, "test: torchao on CPU")
        report = quantize_model(model, "int8", plan=plan)
        out = model(idx).softmax(-1)
    assert report.backend == BACKEND_TORCHAO and "model.layers.0.mlp.up_proj" in report.quantized
    assert (ref - out).abs().max() < 0.05


def test_dtype_and_device_of_a_quantized_model_are_readable():
    from portachat.quant import model_device, model_dtype

    model = tiny_gpt().to(torch.bfloat16)
    quantize_model(model, "int4", plan=cpu_plan("int4"))
    assert model_dtype(model) == torch.bfloat16 and model_device(model) == torch.device("cpu")
    assert model(torch.tensor([[1, 2, 3]])).dtype == torch.float32  # logits come back in fp32
    assert model.model.embed_tokens(torch.tensor([1])).dtype == torch.bfloat16


def test_torchao_configs_for_gpu_plans():
    from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig

    from portachat.device.quantization import decide_quantization as decide
    from portachat.quant.apply import torchao_config
    from tests.device.device_sim import h100

    int4 = torchao_config(decide(h100(), "int4"))
    assert isinstance(int4, Int4WeightOnlyConfig) and int4.group_size == 128
    assert int4.int4_packing_format == "tile_packed_to_4d"
    assert isinstance(torchao_config(decide(h100(), "int8", compiles=True)), Int8WeightOnlyConfig)


def test_quantizing_twice_is_refused():
    model = tiny_gpt()
    quantize_model(model, "int8", plan=cpu_plan("int8"))
    with pytest.raises(QuantizationError, match="already quantized"):
        quantize_model(model, "int4", plan=cpu_plan("int4"))


def test_layers_the_kernel_cannot_take_are_kept_and_reported():
    model = GPT(
        GPTConfig(
            vocab_size=40,
            n_layer=1,
            n_embd=24,
            n_head=2,
            n_kv_head=1,
            head_dim=12,
            intermediate_size=48,
            max_seq_len=16,
        )
    )
    report = quantize_model(model, "int8", plan=cpu_plan("int8"))
    assert report.backend == BACKEND_ATEN_CPU
    assert "model.layers.0.self_attn.q_proj" in report.skipped
    assert "multiple of 16" in report.skipped["model.layers.0.self_attn.q_proj"]
    model(torch.tensor([[1, 2, 3]]))  # the mix of quantized and kept layers still runs


def _stand_in_torchao(monkeypatch, version: str, int4_option: bool) -> None:
    """torchao as an older release looks: Int4WeightOnlyConfig with or without int4_packing_format."""
    if int4_option:
        def int4(group_size: int = 128, int4_packing_format: str = "plain"):
            return ("int4", group_size, int4_packing_format)
    else:
        def int4(group_size: int = 128, use_hqq: bool = False):  # torchao <= 0.13
            return ("int4", group_size)
    quantization = types.ModuleType("torchao.quantization")
    quantization.Int4WeightOnlyConfig = int4
    quantization.Int8WeightOnlyConfig = lambda: ("int8",)
    torchao = types.ModuleType("torchao")
    torchao.__version__ = version
    torchao.quantization = quantization
    monkeypatch.setitem(sys.modules, "torchao", torchao)
    monkeypatch.setitem(sys.modules, "torchao.quantization", quantization)


def test_a_torchao_without_the_int4_option_is_named_not_a_type_error(monkeypatch):
    from portachat.device.quantization import decide_quantization as decide
    from portachat.quant.apply import torchao_config
    from tests.device.device_sim import h100

    _stand_in_torchao(monkeypatch, "0.13.0", int4_option=False)
    monkeypatch.setattr(torch, "__version__", "2.13.0+cpu")  # a current torch: any newer torchao will do
    assert torchao_config(decide(h100(), "int8", compiles=True)) == ("int8",)  # int8 needs no new option
    with pytest.raises(QuantizationError) as e:
        torchao_config(decide(h100(), "int4"))
    assert "torchao 0.13.0" in str(e.value) and "int4_packing_format" in str(e.value)
    assert "pip install 'torchao>=0.15'" in str(e.value) and "--quantize int8" in str(e.value)
    monkeypatch.setattr(torch, "__version__", "2.6.0+cu124")  # an old torch gets the range setup holds
    with pytest.raises(QuantizationError, match=r"pip install 'torchao>=0\.15,<0\.17'"):
        torchao_config(decide(h100(), "int4"))
    _stand_in_torchao(monkeypatch, "0.16.0", int4_option=True)
    assert torchao_config(decide(h100(), "int4")) == ("int4", 128, "tile_packed_to_4d")


class _FailingTorchao(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A torchao built for a newer torch: importing it raises what 0.17+ raises on torch 2.6."""

    def find_spec(self, name, path, target=None):
        return importlib.util.spec_from_loader(name, self) if name.split(".")[0] == "torchao" else None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise AttributeError("module 'torch.utils._pytree' has no attribute 'register_constant'")


def test_a_torchao_that_cannot_import_with_this_torch_says_what_to_install(monkeypatch):
    from portachat.quant.apply import torchao_config

    for name in [m for m in sys.modules if m == "torchao" or m.startswith("torchao.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_FailingTorchao(), *sys.meta_path])
    monkeypatch.setattr(torch, "__version__", "2.6.0")
    plan = QuantPlan("int8", BACKEND_TORCHAO, torch.bfloat16, None, "test")
    with pytest.raises(QuantizationError) as e:
        torchao_config(plan)
    assert "register_constant" in str(e.value) and "pip install 'torchao>=0.15,<0.17'" in str(e.value)
    assert "scripts/setup.sh" in str(e.value)
    with pytest.raises(QuantizationError):  # the whole quant path stops the same way
        quantize_model(tiny_gpt(), "int8", plan=plan)
