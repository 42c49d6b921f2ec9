"""ProbeResults as real machines of each vendor would report them (from their torch APIs)."""

from __future__ import annotations

from portachat.device.probe import ProbeResult

FUSED = ("mps", "cuda", "xpu", "hpu", "cpu", "mtia", "privateuseone")


def h100(**kw) -> ProbeResult:
    base = dict(
        kind="cuda",
        device_type="cuda",
        count=8,
        names=["NVIDIA H100 80GB HBM3"] * 8,
        total_memory=[85_000_000_000] * 8,
        capability=(9, 0),
        torch_version="2.9.0+cu128",
        cuda_version="12.8",
        triton_available=True,
        flex_attention=True,
        fused_optimizer_devices=FUSED,
        default_dist_backend="nccl",
    )
    return ProbeResult(**{**base, **kw})


def v100(**kw) -> ProbeResult:
    return h100(names=["Tesla V100-SXM2-32GB"], count=1, capability=(7, 0), **kw)


def ascend(name: str, bf16: bool | None, **kw) -> ProbeResult:
    base = dict(
        kind="npu",
        device_type="npu",
        count=8,
        names=[name] * 8,
        total_memory=[64 * 2**30] * 8,
        torch_version="2.6.0",
        torch_npu_version="2.6.0",
        torch_npu_installed=True,
        bf16_reported=bf16,
        fused_optimizer_devices=FUSED,
        default_dist_backend="hccl",
        attention_kernels=("npu_fusion_attention",),
    )
    return ProbeResult(**{**base, **kw})


def hip(kind: str, arch: str, name: str = "", **kw) -> ProbeResult:
    base = dict(
        kind=kind,
        device_type="cuda",
        count=8,
        names=[name] * 8,
        total_memory=[64 * 2**30] * 8,
        capability=(9, 0),
        gcn_arch=arch,
        torch_version="2.9.0",
        hip_version="6.3",
        triton_available=True,
        flex_attention=True,
        fused_optimizer_devices=FUSED,
        default_dist_backend="nccl",
    )
    return ProbeResult(**{**base, **kw})


def mps(macos: str = "14.5") -> ProbeResult:
    return ProbeResult(
        kind="mps",
        device_type="mps",
        count=1,
        names=["Apple M2 Max (MPS)"],
        torch_version="2.9.0",
        macos_version=macos,
        fused_optimizer_devices=FUSED,
    )


def xpu(bf16: bool = True) -> ProbeResult:
    return ProbeResult(
        kind="xpu",
        device_type="xpu",
        count=1,
        names=["Intel(R) Data Center GPU Max 1550"],
        torch_version="2.9.0+xpu",
        bf16_reported=bf16,
        triton_available=True,
        fused_optimizer_devices=FUSED,
        default_dist_backend="xccl",
    )



def cpu(**kw) -> ProbeResult:
    """A CPU as /proc/cpuinfo describes it (flags, vendor, family or Arm part, cores, clock)."""
    base = dict(
        kind="cpu",
        device_type="cpu",
        count=1,
        names=["cpu"],
        total_memory=[256 * 2**30],
        torch_version="2.9.0",
        flex_attention=True,
        fused_optimizer_devices=FUSED,
        default_dist_backend="gloo",
    )
    if "name" in kw:
        kw["names"] = [kw.pop("name")]
    return ProbeResult(**{**base, **{f"cpu_{k}" if k in CPU_FIELDS else k: v for k, v in kw.items()}})


CPU_FIELDS = ("flags", "vendor", "family", "part", "cores", "max_mhz", "bf16_speedup")
X86_BASE = ("fpu", "sse2", "avx", "fma", "f16c", "avx2")
AVX512 = ("avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl")


def sapphire_rapids(**kw) -> ProbeResult:
    """Xeon Platinum 8480+: AMX tiles (bf16, int8), AVX512-BF16 and AVX512-FP16."""
    flags = X86_BASE + AVX512 + ("avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile", "amx_int8")
    return cpu(**{**dict(name="Intel(R) Xeon(R) Platinum 8480+", vendor="GenuineIntel", family=6, flags=flags,
                         cores=56, max_mhz=3800.0, bf16_speedup=6.0), **kw})


def zen4(**kw) -> ProbeResult:
    """EPYC 9654: AVX-512 on 256-bit pipes, AVX512-BF16, no AMX."""
    flags = X86_BASE + AVX512 + ("avx512_bf16", "avx512_vnni")
    return cpu(**{**dict(name="AMD EPYC 9654 96-Core Processor", vendor="AuthenticAMD", family=25, flags=flags,
                         cores=96, max_mhz=3700.0, bf16_speedup=2.0), **kw})


def zen3(**kw) -> ProbeResult:
    """EPYC 7763: AVX2 + FMA only, so bf16 is converted to fp32 and computed there."""
    return cpu(**{**dict(name="AMD EPYC 7763 64-Core Processor", vendor="AuthenticAMD", family=25, flags=X86_BASE,
                         cores=64, max_mhz=3500.0), **kw})


def graviton3(**kw) -> ProbeResult:
    """AWS Graviton3 (Neoverse V1): SVE, BF16 (BFMMLA), FP16."""
    flags = ("fp", "asimd", "asimdhp", "asimddp", "sve", "i8mm", "bf16", "svebf16")
    return cpu(**{**dict(name="aarch64", vendor="ARM", part="0x41:0xd40", flags=flags, cores=64, max_mhz=2600.0,
                         bf16_speedup=1.8), **kw})


def graviton2(**kw) -> ProbeResult:
    """AWS Graviton2 (Neoverse N1): NEON and FP16 arithmetic, no BF16."""
    return cpu(**{**dict(name="aarch64", vendor="ARM", part="0x41:0xd0c", flags=("fp", "asimd", "asimdhp", "asimddp"),
                         cores=64, max_mhz=2500.0), **kw})
