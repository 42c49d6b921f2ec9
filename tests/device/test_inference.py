"""Inference-time device choices (dtype, compile, KV-cache budget) on simulated and real devices."""

from __future__ import annotations

import time

import pytest
import torch
from device_sim import ascend, h100, hip, mps, xpu

from portachat.device import Device, MemoryStats, get_device
from portachat.device import inference as inf
from portachat.ops.cpu_linear import (
    RoutedLinear,
    holds_packed_copy,
    pack_linear,
    packed_weight_bytes,
    packing_available,
)
from portachat.ops.paged_attention import decode_attention, prefill_attention


def test_compile_is_opt_in():
    assert inf.decode_compile(Device(h100())).value is False
    assert inf.decode_compile(Device(h100()), requested=True).value is True
    kernels = inf.decode_compile(Device(ascend("Ascend910B", bf16=True)), requested=True, paged_kernels=True)
    assert kernels.value is False and "paged-attention" in kernels.reason and "--compile" in kernels.reason
    forced = inf.decode_compile(Device(mps()), requested=True)
    assert forced.value is True and "eager" in forced.reason


def test_the_reasons_the_startup_line_shows_follow_the_language(monkeypatch):
    monkeypatch.setattr(inf, "graphs_available", lambda device_type: device_type in ("cuda", "npu", "xpu"))
    monkeypatch.setenv("PORTACHAT_LANG", "zh")
    assert inf.decode_graphs(Device(h100()), requested=False).reason == "eager：按要求（--enforce-eager）"
    assert inf.choose_kv_cache_dtype(Device(h100()), torch.bfloat16, "int8").reason == (
        "按要求（int8，每个 token 和 KV 头一个 fp32 缩放因子）")
    monkeypatch.setenv("PORTACHAT_LANG", "en")
    assert inf.decode_graphs(Device(h100()), requested=False).reason == "eager: requested (--enforce-eager)"


def test_decode_graphs_on_for_cuda_unless_eager_is_enforced(monkeypatch):
    monkeypatch.setattr(inf, "graphs_available", lambda device_type: device_type in ("cuda", "npu", "xpu"))
    on = inf.decode_graphs(Device(h100()))
    assert on.value is True and "--enforce-eager" in on.reason
    enforced = inf.decode_graphs(Device(h100()), requested=False)
    assert enforced.value is False and "--enforce-eager" in enforced.reason
    assert inf.decode_graphs(Device(h100()), compiled=True).value is False  # the compiled forward runs
    sharded = inf.decode_graphs(Device(h100()), sharded=True)  # FSDP gathers weights into new memory
    assert sharded.value is False and "FSDP" in sharded.reason
    # Ascend, ROCm and DCU capture as CUDA does, kept only where a replay matched the eager step at start-up
    # (engine/decode_graphs.graphs_proven); other accelerators stay eager unless asked; no capture, no graphs.
    for facts in (ascend("Ascend910B", bf16=True), hip("rocm", "gfx942"), hip("dcu", "gfx936")):
        on = inf.decode_graphs(Device(facts))
        assert on.value is True and "replay matches the eager step" in on.reason
    # Ascend's paged-attention kernel reads each step's context lengths on the host: its decode steps run eager
    paged = inf.decode_graphs(Device(ascend("Ascend910B", bf16=True)), paged_kernels=True)
    assert paged.value is False and "paged-attention" in paged.reason
    off = inf.decode_graphs(Device(xpu()))
    assert off.value is False and "not verified" in off.reason
    assert inf.decode_graphs(Device(xpu()), requested=True).value is True
    assert inf.decode_graphs(Device(mps()), requested=True).value is False


def test_decode_graphs_never_on_a_cpu():
    cpu = get_device("cpu")
    assert inf.decode_graphs(cpu).value is False
    assert inf.decode_graphs(cpu, requested=True).value is False
    packed = inf.decode_graphs(cpu, packed=True)
    assert packed.value is False and "packed" in packed.reason


def test_kv_budget_accelerator_rule(monkeypatch):
    dev = Device(h100())
    gib = 2**30
    stats = MemoryStats(allocated=10 * gib, peak_allocated=None, reserved=None, free=70 * gib, total=80 * gib)
    monkeypatch.setattr(Device, "memory", lambda self: stats)
    # 90% of 80 GiB = 72 GiB, minus 10 GiB in use = 62 GiB, capped by what is wanted.
    assert inf.kv_cache_budget(dev, 0.9, wanted_bytes=100 * gib).value == 62 * gib
    assert inf.kv_cache_budget(dev, 0.9, wanted_bytes=gib).value == gib
    with pytest.raises(ValueError):
        inf.kv_cache_budget(dev, 1.5, gib)


def test_kv_budget_cpu_shares_available_memory():
    dev = get_device("cpu")
    free = dev.memory().free
    budget = inf.kv_cache_budget(dev, 0.5, wanted_bytes=10**15).value
    assert 0 < budget <= 0.5 * free * 1.05  # memory moves a little between the two reads
    assert inf.kv_cache_budget(dev, 0.5, wanted_bytes=1000).value == 1000


def test_bandwidth_measurement_is_positive():
    assert inf.measure_memory_bandwidth(get_device("cpu"), megabytes=8, reps=2) > 1e8


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_linear_equals_linear(dtype):
    if not packing_available("cpu", dtype):
        pytest.skip(f"no packed CPU kernel for {dtype} in this torch build")
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(96, 40, generator=g).to(dtype), torch.randn(96, generator=g).to(dtype)
    f = pack_linear(w, b)
    for rows in (1, 3, 33):
        x = torch.randn(rows, 40, generator=g).to(dtype)
        assert torch.allclose(f(x).float(), torch.nn.functional.linear(x, w, b).float(), atol=1e-4, rtol=1e-3)
    assert pack_linear(w.to(torch.float16)) is None  # no packed fp16 kernel: callers use the module


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_linear_folds_the_norm_weight_and_keeps_no_folded_copy(dtype):
    if not packing_available("cpu", dtype):
        pytest.skip(f"no packed CPU kernel for {dtype} in this torch build")
    g = torch.Generator().manual_seed(0)
    w, scale = torch.randn(96, 40, generator=g).to(dtype), (torch.rand(40, generator=g) + 0.5).to(dtype)
    f = pack_linear(w, in_scale=scale)
    for rows in (1, 3):  # the packed product, and the unpacked fallback for other row counts
        x = torch.randn(rows, 40, generator=g).to(dtype)
        want = torch.nn.functional.linear(x.float() * scale.float(), w.float())
        assert torch.allclose(f(x).float(), want, atol=3e-2 if dtype == torch.bfloat16 else 1e-4, rtol=1e-2)
    functions = [f] if not isinstance(f, RoutedLinear) else [f.fallback]
    held = [c.cell_contents for fn in functions for c in fn.__closure__ if isinstance(c.cell_contents, torch.Tensor)]
    if isinstance(f, RoutedLinear):
        assert f.kernel.weight.data_ptr() == w.data_ptr()  # the own kernel reads the weight in place
    dense = [t for t in held if not t.is_mkldnn and t.numel() == w.numel() and t.stride() != (0, 0)]
    # only the caller's own weight, never a folded copy
    assert all(t.data_ptr() == w.data_ptr() for t in dense)


def test_packed_weight_bytes_follow_the_packing_decision():
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        held = packed_weight_bytes("cpu", dtype, 1000)
        assert (held > 0) == holds_packed_copy("cpu", dtype)
        assert held == 0 or held >= 1000
    assert packed_weight_bytes("cuda", torch.float32, 1000) == 0  # accelerators pack nothing


def test_paged_attention_equals_dense_sdpa():
    g = torch.Generator().manual_seed(0)
    H, H_kv, D, slots = 4, 2, 8, 64
    k_cache, v_cache = torch.randn(slots, H_kv, D, generator=g), torch.randn(slots, H_kv, D, generator=g)
    # Two sequences of lengths 5 and 3 scattered over the cache.
    tables = [torch.tensor([9, 30, 2, 41, 17]), torch.tensor([50, 8, 33])]
    q = torch.randn(2, H, D, generator=g)
    slot_index = torch.stack([tables[0], torch.cat([tables[1], tables[1][:2]])])
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])[:, None, None, :]
    out = decode_attention(q, k_cache.transpose(0, 1).contiguous(), v_cache.transpose(0, 1).contiguous(), slot_index,
                           mask)
    for b, table in enumerate(tables):
        ref = torch.nn.functional.scaled_dot_product_attention(
            q[b][None, :, None], k_cache[table].transpose(0, 1)[None], v_cache[table].transpose(0, 1)[None],
            enable_gqa=True,
        )[0, :, 0]  # fmt: skip
        assert torch.allclose(out[b], ref, atol=1e-5)
    # A chunk of 2 new tokens at positions 3-4 of the first sequence sees keys 0..3 and 0..4.
    causal = torch.arange(5)[None, :] <= torch.tensor([3, 4])[:, None]
    chunk = prefill_attention(q[:1].expand(2, H, D), None, None, k_cache.transpose(0, 1).contiguous(),
                              v_cache.transpose(0, 1).contiguous(), tables[0], causal)
    assert torch.allclose(chunk[1], out[0], atol=1e-5)


def test_kv_cache_dtype_auto_keeps_todays_choice_and_int8_works_everywhere():
    cpu = get_device("cpu")
    auto = inf.choose_kv_cache_dtype(cpu, torch.bfloat16, "auto")
    assert auto.value == torch.float32 and "CPU" in auto.reason
    assert inf.choose_kv_cache_dtype(Device(h100()), torch.bfloat16, None).value == torch.bfloat16
    assert inf.choose_kv_cache_dtype(cpu, torch.float32, "bf16").value == torch.bfloat16
    for dev in (cpu, Device(h100()), Device(ascend("Ascend910B3", bf16=True))):
        assert inf.choose_kv_cache_dtype(dev, torch.bfloat16, "int8").value == torch.int8
    with pytest.raises(ValueError, match="auto, fp32, bf16, fp16, int8, fp8"):
        inf.choose_kv_cache_dtype(cpu, torch.float32, "int4")


def test_fp8_kv_cache_only_where_the_device_has_fp8():
    assert inf.choose_kv_cache_dtype(Device(h100()), torch.bfloat16, "fp8").value == torch.float8_e4m3fn
    mi300 = inf.choose_kv_cache_dtype(Device(hip("rocm", "gfx942")), torch.bfloat16, "fp8")
    assert mi300.value == torch.float8_e4m3fnuz
    for dev in (get_device("cpu"), Device(h100(capability=(8, 0))), Device(ascend("Ascend910B3", bf16=True))):
        # The error names what works here instead.
        with pytest.raises(ValueError, match="has none .*use one of auto, fp32, bf16, fp16, int8"):
            inf.choose_kv_cache_dtype(dev, torch.bfloat16, "fp8")



@pytest.mark.parametrize("slowed", ["copy_", "sum"])
def test_bandwidth_is_the_faster_of_a_copy_and_a_read(monkeypatch, slowed):
    """A decode step mostly reads: the ceiling is whichever of a copy and a read-only pass reaches more,
    so slowing either one down (here to < 0.4 GB/s) leaves the figure of the other."""
    real = getattr(torch.Tensor, slowed)

    def slow(self, *args, **kwargs):
        time.sleep(0.05)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, slowed, slow)
    assert inf.measure_memory_bandwidth(get_device("cpu"), megabytes=8, reps=2) > 2 * 8 * 2**20 / 0.05


def test_the_kv_budget_waits_for_a_profile_where_the_allocator_keeps_a_peak():
    assert inf.profiles_kv_budget(Device(h100()))
    assert inf.profiles_kv_budget(Device(ascend("Ascend910B3", bf16=True)))
    assert not inf.profiles_kv_budget(Device(mps()))  # no high-water mark to read
    assert not inf.profiles_kv_budget(get_device("cpu"))  # a share of free RAM: nothing to profile


def test_the_largest_steps_activations_come_off_the_budget(monkeypatch):
    dev = Device(h100())
    stats = MemoryStats(allocated=None, peak_allocated=None, reserved=None, free=70 * 2**30, total=80 * 2**30)
    monkeypatch.setattr(Device, "memory", lambda self: stats)
    plain = inf.kv_cache_budget(dev, 0.9, 100 * 2**30).value
    profiled = inf.kv_cache_budget(dev, 0.9, 100 * 2**30, transient_bytes=3 * 2**30)
    assert plain == int(0.9 * 80 * 2**30) - 10 * 2**30 and profiled.value == plain - 3 * 2**30
    assert "for the largest step" in profiled.reason
