"""portachat's own CPU kernels: every weight layout against PyTorch, the plain C build as well as the
native one, the build's cache and failure modes, and the routing that pack_linear does."""

from __future__ import annotations

import platform

import pytest
import torch

from portachat.ops import cpu_kernels as ck
from portachat.ops.cpu_linear import KERNEL_ROWS, pack_linear, small_batch_product
from portachat.quant.int4 import Int4Linear, dequantize_int4, quantize_int4
from portachat.quant.int8 import Int8Linear

LIB = ck.library()
needs_lib = pytest.mark.skipif(LIB is None, reason="no C compiler: the kernels are not built here")


def _weights(kind: str, n: int, k: int, g: torch.Generator, group: int = 32):
    """(weight tensor in the kernel's layout, scale, zero, group, dense fp32 reference [n, k])."""
    w = torch.randn(n, k, generator=g) * 0.1
    if kind == "fp32":
        return w, None, None, 0, w
    if kind == "bf16":
        return w.bfloat16(), None, None, 0, w.bfloat16().float()
    if kind == "int8":
        linear = torch.nn.Linear(k, n, bias=False)
        linear.weight.data = w
        m = Int8Linear.from_linear(linear, torch.float32)
        return m.qweight, m.scale, None, 0, m.dequantized_weight()
    codes, scale, zero = quantize_int4(w, group)
    m = Int4Linear(codes, scale, zero, group, torch.float32)
    return m.packed, *m.group_scale_and_code0(), group, dequantize_int4(codes, scale, zero, group)


def _quantization_bound(lib, kind: str, x: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    """How far the product of x may be from the fp32 one beyond rounding: 0, or where the kernels multiply
    int8/int4 as integers (W times x rounded to int8 in blocks of 32), |W| times the rounding (<= the
    block's max / 254 per input)."""
    k = x.size(1)
    if kind not in ("int8", "int4") or k % 32 or not ck.integer_products(lib):
        return torch.zeros(x.size(0), dense.size(0))
    step = x.view(x.size(0), -1, 32).abs().amax(-1, keepdim=True).expand(-1, -1, 32).reshape(x.shape) / 254
    return step @ dense.abs().t()


def _check_library(lib, kinds=("fp32", "bf16", "int8", "int4")) -> None:
    g = torch.Generator().manual_seed(0)
    # Shapes with tails: rows not a multiple of the block, inputs not a multiple of the vector width
    # (int8 at 48 and 16 inputs keeps the fp32 path, 64 and 96 multiply integers); int4 needs PyTorch's
    # own constraints (rows % 16, a last block of 16 rows, inputs % 32).
    shapes = {"int4": [(64, 64), (48, 96)], "int8": [(40, 48), (7, 16), (40, 64), (36, 96)]}
    for kind in kinds:
        for n, k in shapes.get(kind, [(37, 40), (8, 13)]):
            weight, scale, zero, group, dense = _weights(kind, n, k, g)
            bias, in_scale = torch.randn(n, generator=g), torch.rand(k, generator=g) + 0.5
            f = ck.SmallBatchLinear(lib, kind, weight, n, k, scale, zero, group, in_scale, bias)
            for rows in (1, 2, 3, 5, ck.MAX_ROWS + 3):  # the last: two calls
                x = torch.randn(rows, k, generator=g)
                want = torch.nn.functional.linear(x * in_scale, dense, bias)
                got = f(x)
                assert got.dtype == torch.float32 and got.shape == (rows, n)
                bound = _quantization_bound(lib, kind, x * in_scale, dense)
                assert ((got - want).abs() <= bound + 1e-4 + 1e-4 * want.abs()).all(), (kind, n, k, rows)
                got_bf16 = f(x.bfloat16())  # bf16 in, bf16 out (rounded once, at the end)
                x_bf16 = x.bfloat16().float() * in_scale
                want_bf16 = torch.nn.functional.linear(x_bf16, dense, bias)
                bound = _quantization_bound(lib, kind, x_bf16, dense)
                assert got_bf16.dtype == torch.bfloat16
                err = (got_bf16.float() - want_bf16).abs()
                assert (err <= bound * 1.01 + 2e-2 + 1e-2 * want_bf16.abs()).all(), (kind, n, k, rows)


def test_integer_products_round_x_within_the_bound():
    """The integer products do round x (their error is a sizeable part of the bound; an fp32 path sits
    at ~0), and stay within the bound."""
    if LIB is None or not ck.integer_products(LIB):
        pytest.skip("this build widens int8/int4 to fp32 (no AVX2)")
    g = torch.Generator().manual_seed(1)
    for kind in ("int8", "int4"):
        weight, scale, zero, group, dense = _weights(kind, 64, 256, g)
        f = ck.SmallBatchLinear(LIB, kind, weight, 64, 256, scale, zero, group)
        x = torch.randn(8, 256, generator=g)
        got = f(x)
        ratio = (got - x @ dense.t()).abs() / _quantization_bound(LIB, kind, x, dense)
        assert 0.01 < float(ratio.max()) <= 1.0, kind


@needs_lib
@pytest.mark.parametrize("kind", ["fp32", "bf16", "int8", "int4", "int4-g128"])
def test_a_rows_output_does_not_depend_on_the_batch(kind):
    """The same bits for a row of x alone or among others (1, 2, 3, 37 or 40 rows: every path the
    kernels take), so a K+1-row speculative verification scores each position as plain decoding does,
    and a prompt resumed from the prefix cache as the whole prompt did."""
    g = torch.Generator().manual_seed(2)
    kind, _, group = kind.partition("-g")
    weight, scale, zero, group, dense = _weights(kind, 64, 256, g, int(group or 32))
    f = ck.SmallBatchLinear(LIB, kind, weight, 64, 256, scale, zero, group, torch.rand(256, generator=g) + 0.5)
    x = torch.randn(40, 256, generator=g)
    bound = _quantization_bound(LIB, kind, x * f.in_scale, dense)
    assert ((f(x) - (x * f.in_scale) @ dense.t()).abs() <= bound + 1e-4).all()
    for dtype in (torch.float32, torch.bfloat16):
        got = f(x.to(dtype))
        for i in (0, 5, 7, 39):
            assert torch.equal(f(x[i : i + 1].to(dtype)), got[i : i + 1]), (kind, dtype, i)
        assert torch.equal(f(x[5:7].to(dtype)), got[5:7]), (kind, dtype)
        assert torch.equal(f(x[4:7].to(dtype))[1], got[5]), (kind, dtype)
        assert torch.equal(f(x[3:].to(dtype)), got[3:]), (kind, dtype)


@needs_lib
@pytest.mark.parametrize("block", [32, 64])
@pytest.mark.parametrize("integer", [True, False])
def test_int4_is_read_in_either_packing_layout_pytorch_writes(monkeypatch, block, integer):
    """PyTorch packs int4 rows in blocks of 32 (its AVX2 build) or 64 (AVX-512): the kernels read both,
    whichever this machine's PyTorch writes. 112 rows: full blocks and a partial last one in either
    layout (3 x 32 + 16, 64 + 48); each row the same bits alone or among 40."""
    assert ck.int4_packing_block() in (32, 64)  # what this machine's PyTorch writes is one of them
    monkeypatch.setattr(ck, "int4_packing_block", lambda: block)
    g = torch.Generator().manual_seed(3)
    n, k, group = 112, 128, 32
    codes, scale, zero = quantize_int4(torch.randn(n, k, generator=g) * 0.1, group)
    module, dense = Int4Linear(codes, scale, zero, group, torch.float32), dequantize_int4(codes, scale, zero, group)
    packed = ck._int4_packed(codes, block).view(n, k // 2)
    was = ck.set_integer_products(LIB, integer)
    try:
        f = ck.SmallBatchLinear(LIB, "int4", packed, n, k, *module.group_scale_and_code0(), group)
        x = torch.randn(40, k, generator=g)
        got, want = f(x), x @ dense.t()
        assert ((got - want).abs() <= _quantization_bound(LIB, "int4", x, dense) + 1e-4 + 1e-4 * want.abs()).all()
        for i in (0, 17, 39):
            assert torch.equal(f(x[i : i + 1]), got[i : i + 1]), i
    finally:
        ck.set_integer_products(LIB, was)


@needs_lib
def test_native_kernels_equal_pytorch_for_every_layout():
    _check_library(LIB)


@needs_lib
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 baseline flags")
def test_plain_c_build_without_avx2_equals_pytorch(tmp_path):
    # The path a CPU without AVX2 (or an Arm host) compiles: the scalar loops, vectorized by the compiler.
    flags = ("-O2", "-march=x86-64", "-fopenmp", "-shared", "-fPIC")
    _check_library(ck.load(ck.build(flags, out=tmp_path / "plain.so")))


def test_build_is_cached_and_atomic(tmp_path, monkeypatch):
    if ck.compiler() is None:
        pytest.skip("no C compiler")
    monkeypatch.setenv("PORTACHAT_KERNEL_CACHE", str(tmp_path))
    first = ck.build()
    mtime = first.stat().st_mtime_ns
    assert ck.build() == first and first.stat().st_mtime_ns == mtime  # reused, not rebuilt
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary left behind


def test_a_failing_compiler_leaves_nothing_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("PORTACHAT_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "false")
    with pytest.raises(RuntimeError, match="failed to build"):
        ck.build()
    assert list(tmp_path.iterdir()) == []


def test_kernels_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("PORTACHAT_CPU_KERNELS", "0")
    ck.library.cache_clear()
    try:
        assert ck.library() is None
        w = torch.randn(8, 16)
        f = small_batch_product(lambda x: x @ w.T, "fp32", w, 8, 16)
        x = torch.randn(1, 16)
        assert torch.equal(f(x), x @ w.T)  # the fallback itself
    finally:
        ck.library.cache_clear()


@needs_lib
def test_pack_linear_routes_rows_and_equals_linear():
    g = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.bfloat16):
        w, b = torch.randn(48, 64, generator=g).to(dtype), torch.randn(48, generator=g).to(dtype)
        f = pack_linear(w, b)
        assert f is not None
        # own kernel (few rows), the library (fp32 beyond its rows), bf16 in chunks of the kernel's rows
        for rows in (1, 4, KERNEL_ROWS["fp32"] + 1, ck.MAX_ROWS + 3):
            x = torch.randn(rows, 64, generator=g).to(dtype)
            want = torch.nn.functional.linear(x.float(), w.float(), b.float())
            tol = 3e-2 if dtype == torch.bfloat16 else 1e-4
            assert f(x).dtype == dtype
            assert torch.allclose(f(x).float(), want, atol=tol, rtol=tol), (dtype, rows)


@needs_lib
def test_a_layout_the_kernel_does_not_read_keeps_the_fallback():
    w = torch.randn(32, 64)
    fallback = Int4Linear(*quantize_int4(w, 32), 32, torch.float32)
    wrong = torch.zeros_like(fallback.packed)  # not the codes the module holds
    f = small_batch_product(fallback, "int4", wrong, 32, 64, *fallback.group_scale_and_code0(), 32)
    assert f is fallback


@needs_lib
def test_many_bf16_rows_run_fp32_gemms_over_widened_slices(monkeypatch):
    from portachat.ops import cpu_linear

    monkeypatch.setattr(cpu_linear, "WIDENED_SLICE", 10 * 64)  # 10 rows of the weight at a time: 5 slices
    monkeypatch.setattr(cpu_linear, "_mkldnn_bf16", lambda: False)  # the route of CPUs without oneDNN's bf16
    g = torch.Generator().manual_seed(2)
    w, b = torch.randn(48, 64, generator=g).bfloat16(), torch.randn(48, generator=g).bfloat16()
    scale = torch.rand(64, generator=g) + 0.5
    f = pack_linear(w, b, in_scale=scale)
    x = torch.randn(KERNEL_ROWS["bf16"] + 7, 64, generator=g).bfloat16()
    want = torch.nn.functional.linear(x.float() * scale, w.float(), b.float())
    assert f(x).dtype == torch.bfloat16
    assert torch.allclose(f(x).float(), want, atol=3e-2, rtol=1e-2)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_integer_products_keep_smollm2_perplexity(shakespeare_path, mode):
    """On the real SmolLM2, scored through the engine's own decode steps (the whole-step kernels), the
    integer products cost at most 1% perplexity on tinyshakespeare against the same int8/int4 weights
    multiplied without rounding x (the kernels' fp32 path, ATen's for int4 batches; measured: int8
    +0.25%, int4 -0.1%)."""
    import copy

    from smollm2 import smollm2_gguf_path

    from portachat.device import get_device
    from portachat.engine.oneshot import engine_for
    from portachat.engine.scoring import perplexity, teacher_forced_logprobs
    from portachat.model.load import load_for_inference
    from portachat.quant import quantize_model

    if LIB is None or not ck.integer_products(LIB):
        pytest.skip("this build widens int8/int4 to fp32 (no AVX2)")
    loaded = load_for_inference(smollm2_gguf_path(), device="cpu", dtype="fp32")
    ids = loaded.tokenizer.encode(shakespeare_path.read_text(encoding="utf-8")[-4000:])
    texts = [ids[i : i + 128] for i in range(0, 512, 128)]
    model = copy.deepcopy(loaded.model)
    quantize_model(model, mode, get_device("cpu"))
    ppl = {}
    for integer in (True, False):
        ck.set_integer_products(LIB, integer)
        try:
            engine = engine_for(model, max_model_len=160, max_num_seqs=len(texts))
            if integer:
                assert engine.runner.packed is not None and engine.runner.packed.decode_rows >= len(texts)
            ppl[integer] = perplexity(teacher_forced_logprobs(engine, texts))
        finally:
            ck.set_integer_products(LIB, True)
    assert abs(ppl[True] / ppl[False] - 1) < 0.01, ppl
