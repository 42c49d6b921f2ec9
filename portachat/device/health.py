"""Environment health: versions, visible devices and the known-bad vendor combinations, each with its fix.

Pure functions of a ProbeResult (plus `npu-smi` text for device health), so doctor stays vendor-free
and every check can be tested with simulated facts.
"""

from __future__ import annotations

import platform
import re
from dataclasses import asdict, dataclass

import portachat
from portachat.device.probe import TOOLKIT_VARS, VISIBLE_DEVICE_VARS, ProbeResult, run_cli
from portachat.device.telemetry import parse_npu_smi_info
from portachat.i18n import N_, _

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
    fix = _("pip install 'torch_npu=={release}.*' (or the torch release matching torch_npu {npu})").format(
        release=".".join(map(str, t)), npu=npu_version)
    name = N_("torch/torch_npu versions")
    if t[:2] != n[:2]:
        return Check(
            name,
            False,
            "error",
            _("torch {torch} with torch_npu {npu}: not a published pair").format(torch=torch_version, npu=npu_version),
            fix,
        )
    if len(t) > 2 and len(n) > 2 and t[2] != n[2]:
        return Check(
            name,
            False,
            "warning",
            _("torch {torch} with torch_npu {npu}: patch releases differ").format(torch=torch_version, npu=npu_version),
            fix,
        )
    return Check(name, True, "info", f"torch {torch_version} / torch_npu {npu_version}")


def environment_checks(p: ProbeResult, devices: list[dict] | None = None) -> list[Check]:
    """Known-bad combinations on this machine, each failing check with a concrete fix."""
    checks: list[Check] = []
    if p.torch_npu_installed and p.cuda_version:
        checks.append(
            Check(
                N_("torch_npu beside CUDA torch"),
                False,
                "error",
                _("torch_npu is installed next to a CUDA build of torch ({torch}); they conflict").format(
                    torch=p.torch_version),
                _("reinstall torch from the CPU wheel index ({command}) then the matching torch_npu").format(
                    command="pip install torch --index-url https://download.pytorch.org/whl/cpu"),
            )
        )
    if p.transfer_to_npu_imported:
        checks.append(
            Check(
                N_("transfer_to_npu imported"),
                False,
                "error",
                _("torch_npu.contrib.transfer_to_npu is imported: it rewrites torch.cuda globally"),
                _("remove `import torch_npu.contrib.transfer_to_npu`; portachat selects the NPU by itself"),
            )
        )
    if p.torch_npu_installed:
        if not (p.env.get("ASCEND_TOOLKIT_HOME") or p.env.get("ASCEND_HOME_PATH")):
            checks.append(
                Check(
                    N_("CANN environment"),
                    False,
                    "error",
                    _("torch_npu is installed but the CANN environment is not sourced (ASCEND_TOOLKIT_HOME unset)"),
                    CANN_SET_ENV,
                )
            )
        if p.torch_npu_error:
            checks.append(
                Check(
                    N_("torch_npu import"),
                    False,
                    "error",
                    _("import torch_npu failed: {error}").format(error=p.torch_npu_error),
                    _("{set_env}; then check `npu-smi info` and the torch/torch_npu pair").format(set_env=CANN_SET_ENV),
                )
            )
        if p.torch_npu_version:
            checks.append(torch_npu_pair_check(p.torch_version, p.torch_npu_version))
    if p.hip_version and (p.kind == "dcu" or p.vendor_clis.get("hy-smi")):
        if not (p.env.get("ROCM_PATH") or p.env.get("DTK_HOME")):
            checks.append(
                Check(
                    N_("DTK environment"),
                    False,
                    "error",
                    _("HIP torch on a Hygon DCU but the DTK environment is not loaded (ROCM_PATH / DTK_HOME unset)"),
                    DTK_SET_ENV,
                )
            )
    if p.kind == "cpu":
        hints = (
            (
                "nvidia-smi",
                p.cuda_version,
                _("an NVIDIA GPU"),
                _("install a CUDA build of torch ({url})").format(url="https://pytorch.org/get-started"),
            ),
            (
                "npu-smi",
                p.torch_npu_installed,
                _("an Ascend NPU"),
                _("pip install torch_npu matching torch, then {set_env}").format(set_env=CANN_SET_ENV),
            ),
            ("hy-smi", p.hip_version, _("a Hygon DCU"),
             _("install the DTK build of torch, then {set_env}").format(set_env=DTK_SET_ENV)),
            (
                "rocm-smi",
                p.hip_version,
                _("an AMD GPU"),
                _("install a ROCm build of torch ({url})").format(url="https://pytorch.org/get-started"),
            ),
        )
        for cli, have_build, what, fix in hints:
            if p.vendor_clis.get(cli):
                msg = (
                    _("{cli} is present ({what}) but torch sees no device").format(cli=cli, what=what)
                    if have_build
                    else _("{cli} is present ({what}) but torch {torch} has no support for it").format(
                        cli=cli, what=what, torch=p.torch_version)
                )
                checks.append(Check(N_("accelerator unused"), False, "warning", msg, fix))
    for dev in devices or []:
        if dev.get("health") not in (None, "OK"):
            checks.append(
                Check(
                    N_("device health"),
                    False,
                    "error",
                    _("device {index} ({name}) reports health {health}").format(
                        index=dev["index"], name=dev["name"], health=repr(dev["health"])),
                    _("inspect with the vendor tool ({command}) and reset or replace the device").format(
                        command="npu-smi info -t health -i <id>"),
                )
            )
    return checks
