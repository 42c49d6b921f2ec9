"""Environment health: versions, visible devices and the known-bad vendor combinations, each with its fix.

Pure functions of a ProbeResult (plus `npu-smi` text for device health), so doctor stays vendor-free
and every check can be tested with simulated facts.
"""

from __future__ import annotations

import platform
import re
from dataclasses import asdict, dataclass

from portachat.device.probe import TOOLKIT_VARS, VISIBLE_DEVICE_VARS, ProbeResult, run_cli
from portachat.device.telemetry import parse_npu_smi_info

CANN_SET_ENV = "source /usr/local/Ascend/ascend-toolkit/set_env.sh"
DTK_SET_ENV = "source /opt/dtk/env.sh"


@dataclass
class Check:
    name: str
    ok: bool
    severity: str  # "error" | "warning" | "info"
    message: str
    fix: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def versions(p: ProbeResult) -> dict[str, str | None]:
    import portachat

    return {
        "portachat": portachat.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": p.torch_version,
        "cuda (torch build)": p.cuda_version,
        "rocm/hip (torch build)": p.hip_version,
        "torch_npu": p.torch_npu_version,
        "cann": p.cann_version,
        "dtk": p.dtk_version,
    }


def visible_env(p: ProbeResult) -> dict[str, str]:
    """The device-visibility and toolkit variables that are set (they explain "where did my GPU go")."""
    return {k: v for k, v in p.env.items() if k in VISIBLE_DEVICE_VARS + TOOLKIT_VARS}


def device_health(p: ProbeResult) -> list[dict]:
    """One entry per visible device: index, name, total memory, health where the vendor reports it."""
    health: list[str | None] = [None] * p.count
    if p.kind == "npu":
        out = run_cli(["npu-smi", "info"], timeout_s=5)
        entries = parse_npu_smi_info(out) if out else []
        for i in range(p.count):
            if i < len(entries):
                health[i] = entries[i].health
    return [
        {
            "index": i,
            "name": p.names[i] if i < len(p.names) else p.name,
            "total_memory": p.total_memory[i] if i < len(p.total_memory) else None,
            "health": health[i],
        }
        for i in range(p.count)
    ]


def _release(version: str) -> tuple[int, ...]:
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    return tuple(int(x) for x in m.groups() if x is not None) if m else ()


def torch_npu_pair_check(torch_version: str, npu_version: str) -> Check:
    """torch_npu X.Y.Z[.postN] is published for torch X.Y.Z: the release numbers must match."""
    t, n = _release(torch_version), _release(npu_version)
    fix = f"pip install 'torch_npu=={'.'.join(map(str, t))}.*' (or the torch release matching torch_npu {npu_version})"
    if t[:2] != n[:2]:
        return Check(
            "torch/torch_npu versions",
            False,
            "error",
            f"torch {torch_version} with torch_npu {npu_version}: not a published pair",
            fix,
        )
    if len(t) > 2 and len(n) > 2 and t[2] != n[2]:
        return Check(
            "torch/torch_npu versions",
            False,
            "warning",
            f"torch {torch_version} with torch_npu {npu_version}: patch releases differ",
            fix,
        )
    return Check("torch/torch_npu versions", True, "info", f"torch {torch_version} / torch_npu {npu_version}")


def environment_checks(p: ProbeResult, devices: list[dict] | None = None) -> list[Check]:
    """Known-bad combinations on this machine, each failing check with a concrete fix."""
    checks: list[Check] = []
    if p.torch_npu_installed and p.cuda_version:
        checks.append(
            Check(
                "torch_npu beside CUDA torch",
                False,
                "error",
                f"torch_npu is installed next to a CUDA build of torch ({p.torch_version}); they conflict",
                "reinstall torch from the CPU wheel index (pip install torch --index-url https://download.pytorch.org/whl/cpu) "
                "then the matching torch_npu",
            )
        )
    if p.transfer_to_npu_imported:
        checks.append(
            Check(
                "transfer_to_npu imported",
                False,
                "error",
                "torch_npu.contrib.transfer_to_npu is imported: it rewrites torch.cuda globally",
                "remove `import torch_npu.contrib.transfer_to_npu`; portachat selects the NPU by itself",
            )
        )
    if p.torch_npu_installed:
        if not (p.env.get("ASCEND_TOOLKIT_HOME") or p.env.get("ASCEND_HOME_PATH")):
            checks.append(
                Check(
                    "CANN environment",
                    False,
                    "error",
                    "torch_npu is installed but the CANN environment is not sourced (ASCEND_TOOLKIT_HOME unset)",
                    CANN_SET_ENV,
                )
            )
        if p.torch_npu_error:
            checks.append(
                Check(
                    "torch_npu import",
                    False,
                    "error",
                    f"import torch_npu failed: {p.torch_npu_error}",
                    f"{CANN_SET_ENV}; then check `npu-smi info` and the torch/torch_npu pair",
                )
            )
        if p.torch_npu_version:
            checks.append(torch_npu_pair_check(p.torch_version, p.torch_npu_version))
    if p.hip_version and (p.kind == "dcu" or p.vendor_clis.get("hy-smi")):
        if not (p.env.get("ROCM_PATH") or p.env.get("DTK_HOME")):
            checks.append(
                Check(
                    "DTK environment",
                    False,
                    "error",
                    "HIP torch on a Hygon DCU but the DTK environment is not loaded (ROCM_PATH / DTK_HOME unset)",
                    DTK_SET_ENV,
                )
            )
    if p.kind == "cpu":
        hints = (
            (
                "nvidia-smi",
                p.cuda_version,
                "an NVIDIA GPU",
                "install a CUDA build of torch (https://pytorch.org/get-started)",
            ),
            (
                "npu-smi",
                p.torch_npu_installed,
                "an Ascend NPU",
                f"pip install torch_npu matching torch, then {CANN_SET_ENV}",
            ),
            ("hy-smi", p.hip_version, "a Hygon DCU", f"install the DTK build of torch, then {DTK_SET_ENV}"),
            (
                "rocm-smi",
                p.hip_version,
                "an AMD GPU",
                "install a ROCm build of torch (https://pytorch.org/get-started)",
            ),
        )
        for cli, have_build, what, fix in hints:
            if p.vendor_clis.get(cli):
                msg = (
                    f"{cli} is present ({what}) but torch sees no device"
                    if have_build
                    else f"{cli} is present ({what}) but torch {p.torch_version} has no support for it"
                )
                checks.append(Check("accelerator unused", False, "warning", msg, fix))
    for dev in devices or []:
        if dev.get("health") not in (None, "OK"):
            checks.append(
                Check(
                    f"device {dev['index']} health",
                    False,
                    "error",
                    f"{dev['name']} reports health {dev['health']!r}",
                    "inspect with the vendor tool (npu-smi info -t health -i <id>) and reset or replace the device",
                )
            )
    return checks
