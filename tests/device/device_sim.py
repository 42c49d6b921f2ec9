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
