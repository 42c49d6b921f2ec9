"""The engine's forward equals the model's plain forward for every family our GPT covers
(Qwen3 with QK-norm, Qwen2 with q/k/v biases, Llama with neither, rope scaling), and for the real
SmolLM2-135M (slow)."""

from __future__ import annotations

import pytest
import torch
from engine_testing import make_engine, plain_greedy, plain_logprobs, prompts_of, tiny_model
from smollm2 import smollm2_gguf_path

from portachat.engine import SamplingParams

FAMILIES = {
    "qwen3": dict(),
    "qwen2-bias": dict(architecture="qwen2", qk_norm=False, attention_bias=True),
    "llama": dict(architecture="llama", qk_norm=False),
    "llama-rope-scaling": dict(
        architecture="llama",
        qk_norm=False,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    ),
}


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("frozen", [False, True], ids=["modules", "packed"])
def test_engine_equals_plain_forward(chat_tokenizer, family, frozen):
    """A model still training runs its own modules; a frozen one the packed CPU path (norm weights
    folded into the products, fp32 rotary and attention). Both give the plain forward's greedy
    tokens and logprobs in fp32."""
    model = tiny_model(chat_tokenizer.vocab_size, seed=3, **FAMILIES[family]).requires_grad_(not frozen)
    engine = make_engine(chat_tokenizer, model=model)
    assert (engine.runner.packed is not None) == frozen
    prompts = prompts_of([13, 4, 22], chat_tokenizer.vocab_size, seed=12)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=True)
    for prompt, c in zip(prompts, engine.generate(prompts, params), strict=True):
        assert c.token_ids == plain_greedy(model, prompt, 8)
        expected = plain_logprobs(model, prompt, c.token_ids)
        assert torch.allclose(torch.tensor(c.logprobs), torch.tensor(expected), atol=1e-4)


def test_packing_fuses_weights_without_a_second_copy(chat_tokenizer):
    """q/k/v and gate/up run as one product each; the modules' weights become views of the fused
    weight (same values, one storage), so the packed path holds no extra unpacked copy."""
    import copy

    model = tiny_model(chat_tokenizer.vocab_size, seed=4, **FAMILIES["qwen2-bias"]).requires_grad_(False)
    before = copy.deepcopy(model.state_dict())
    engine = make_engine(chat_tokenizer, model=model)
    if engine.runner.packed is None:
        pytest.skip("no packed CPU kernels in this torch build")
    for block in model.model.layers:
        attn, mlp = block.self_attn, block.mlp
        for group in ((attn.q_proj, attn.k_proj, attn.v_proj), (mlp.gate_proj, mlp.up_proj)):
            storages = {m.weight.untyped_storage().data_ptr() for m in group}
            assert len(storages) == 1
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_packed_bf16_forward_stays_close_to_the_module_path(chat_tokenizer):
    """In bf16 the fused path rounds differently from the bf16 modules (packed kernels: one rounding of
    W*w instead of two of the normalised activations; unpacked: the norm's scale applied in fp32; the
    own kernels: fp32 activations between bf16 weights and the bf16 residual), so each is held to the
    exact (fp32) forward: no further from it than the bf16 modules are, within bf16 noise."""
    import copy

    from portachat.ops.cpu_linear import fused_forward_available

    if not fused_forward_available("cpu", torch.bfloat16):
        pytest.skip("no fused bf16 CPU forward in this torch build: bf16 runs the module path")
    model = tiny_model(chat_tokenizer.vocab_size, seed=5, **FAMILIES["qwen2-bias"]).requires_grad_(False)
    exact = copy.deepcopy(model)
    modules = copy.deepcopy(model).to(torch.bfloat16)
    packed = make_engine(chat_tokenizer, model=model, dtype="bf16")
    assert packed.runner.packed is not None
    prompts = prompts_of([13, 22], chat_tokenizer.vocab_size, seed=9)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=True)
    for prompt, c in zip(prompts, packed.generate(prompts, params), strict=True):
        expected = torch.tensor(plain_logprobs(exact, prompt, c.token_ids))
        fused_error = (torch.tensor(c.logprobs) - expected).abs().max()
        modules_error = (torch.tensor(plain_logprobs(modules, prompt, c.token_ids)) - expected).abs().max()
        assert fused_error <= 1.5 * modules_error + 0.05, (fused_error, modules_error)


@pytest.mark.slow
def test_smollm2_concurrent_greedy_equals_plain_forward():
    from portachat.device import get_device
    from portachat.engine import EngineConfig, LLMEngine
    from portachat.model.load import load_for_inference

    loaded = load_for_inference(smollm2_gguf_path(), device="cpu", dtype="fp32")
    tok = loaded.tokenizer
    engine = LLMEngine(
        loaded.model,
        tok,
        EngineConfig(
            dtype="model", max_model_len=256, max_num_seqs=4, max_num_batched_tokens=32, compile=False
        ),
        device=get_device("cpu"),
    )
    questions = ["What is the capital of France?", "Write a haiku about rain.", "2+2="]
    prompts = [tok.render_prompt([{"role": "user", "content": q}]) for q in questions]
    completions = engine.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0))
    for prompt, c in zip(prompts, completions, strict=True):
        assert c.token_ids == plain_greedy(loaded.model, prompt, 8, stop_ids=tok.stop_ids)
        assert c.text and "\ufffd" not in c.text
    assert "Paris" in completions[0].text


@pytest.fixture
def fp32_products():
    """The own kernels multiply int8/int4 weights in fp32 (not as integers over x rounded to int8), so
    a fused or whole-step forward can be held to the modules' to 1e-3: these tests check the fusing,
    tests/ops/test_cpu_kernels.py the integer products."""
    from portachat.ops import cpu_kernels

    lib = cpu_kernels.library()
    was = lib is not None and cpu_kernels.set_integer_products(lib, False)
    yield
    if lib is not None:
        cpu_kernels.set_integer_products(lib, was)


def _fusable(mode: str) -> dict:
    """int4 q/k/v fuse by stacking PyTorch's packed rows, which keeps its layout where every part but the
    last is whole packing blocks (64 rows on AVX-512): k and v of 64 rows, not the tiny model's 32."""
    return dict(head_dim=32) if mode == "int4" else {}


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_quantized_models_run_the_fused_forward(chat_tokenizer, fp32_products, mode):
    """int8/int4 weights: q/k/v and gate/up fused (portachat.quant.fuse), the norm weight applied to
    the products' input. With fp32 activations (same kernels, no bf16 rounding in between) greedy
    tokens and logprobs equal the modules' forward."""
    from portachat.device import get_device
    from portachat.quant import Int4Linear, Int8Linear, quantize_model

    model = tiny_model(chat_tokenizer.vocab_size, seed=6, **FAMILIES["qwen2-bias"], **_fusable(mode))
    model.requires_grad_(False)
    quantize_model(model, mode, get_device("cpu"))
    for m in model.modules():
        if isinstance(m, (Int8Linear, Int4Linear)):
            m.activation_dtype = torch.float32
    fused = make_engine(chat_tokenizer, model=model, dtype="model")
    if fused.runner.packed is None:
        pytest.skip(f"no fused CPU forward for {mode} here")
    modules = make_engine(chat_tokenizer, model=model, dtype="model")
    modules.runner.packed = None
    prompts = prompts_of([13, 22], chat_tokenizer.vocab_size, seed=9)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=True)
    for a, b in zip(fused.generate(prompts, params), modules.generate(prompts, params), strict=True):
        assert a.token_ids == b.token_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-3)


@pytest.mark.parametrize("family", ["llama", "qwen2-bias", "llama-rope-scaling"])
@pytest.mark.parametrize("mode", ["fp32", "int8", "int4"])
def test_decode_steps_on_the_own_cpu_kernels_equal_the_fused_forward(chat_tokenizer, monkeypatch, fp32_products,
                                                                     family, mode):  # fmt: skip
    """Decode-only steps run as five kernel calls a layer (norms, SwiGLU, residuals, rotary, cache
    writes and attention fused: PackedModel.forward_decode); with fp32 activations their greedy tokens
    and logprobs equal the fused PyTorch forward's, batch 1 and a padded batch of 3."""
    from portachat.device import get_device
    from portachat.engine.packed_forward import PackedModel
    from portachat.ops.cpu_kernels import library
    from portachat.quant import Int4Linear, Int8Linear, quantize_model

    if library() is None:
        pytest.skip("no C compiler: the own CPU kernels are not built here")
    model = tiny_model(chat_tokenizer.vocab_size, seed=4, **FAMILIES[family], **_fusable(mode)).requires_grad_(False)
    if mode != "fp32":
        quantize_model(model, mode, get_device("cpu"))
        for m in model.modules():
            if isinstance(m, (Int8Linear, Int4Linear)):
                m.activation_dtype = torch.float32
    on_kernels = make_engine(chat_tokenizer, model=model, dtype="model")
    assert on_kernels.runner.packed.decode_rows >= 1
    calls = []
    original = PackedModel.forward_decode
    monkeypatch.setattr(PackedModel, "forward_decode", lambda self, *a: calls.append(1) or original(self, *a))
    reference = make_engine(chat_tokenizer, model=model, dtype="model")
    reference.runner.packed.decode_rows = 0  # the fused PyTorch forward for every step
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=True)
    batches = [prompts_of([11], chat_tokenizer.vocab_size, seed=2)]
    if mode != "int4":  # int4 runs its own kernel at batch 1 only
        batches.append(prompts_of([13, 4, 22], chat_tokenizer.vocab_size, seed=12))
    for prompts in batches:
        calls.clear()
        got = on_kernels.generate(prompts, params)
        assert calls, "no step ran on the kernels"
        for a, b in zip(got, reference.generate(prompts, params), strict=True):
            assert a.token_ids == b.token_ids
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-3)
