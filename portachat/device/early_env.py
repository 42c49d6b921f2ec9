"""Runtime environment defaults that must be set before `import torch` (stdlib and i18n only: no torch).

torch >= 2.5 autoloads torch_npu when torch is imported, and torch_npu reads its settings
(PYTORCH_NPU_ALLOC_CONF, TASK_QUEUE_ENABLE, CPU_AFFINITY_CONF, HCCL timeouts) once, then; on a Hygon
DCU the HSA/HIP runtime and RCCL read theirs when the device starts. So the command line calls
`apply_early_defaults()` first thing, before anything imports torch; the host is
recognised from what the driver and toolkit leave on disk and in the environment (device nodes,
install paths, the variables their set_env.sh exports), not from torch. A value the user set is
never replaced.
"""

from __future__ import annotations

import glob
import os
import shutil
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

from portachat.i18n import _

DIST_TIMEOUT_ENV = "PORTACHAT_DIST_TIMEOUT"
DEFAULT_DIST_TIMEOUT_S = 7200
HCCL_CONNECT_RANGE = (120, 7200)  # CANN's documented range for HCCL_CONNECT_TIMEOUT (default 120 s)
HCCL_EXEC_RANGE = (68, 17340)  # and for HCCL_EXEC_TIMEOUT (default 1800 s)

# What an Ascend host shows without torch: the davinci device nodes, the driver/toolkit install, the
# variables CANN's set_env.sh exports, npu-smi. A Hygon DCU host: DTK's install and variables, hy-smi.
ASCEND_PATHS = ("dev/davinci_manager", "usr/local/Ascend/driver", "usr/local/Ascend/ascend-toolkit")
ASCEND_VARS = ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH", "ASCEND_OPP_PATH")
DCU_PATHS = ("opt/dtk", "opt/hyhal")
DCU_VARS = ("DTK_HOME",)

_SET_BY_US: set[str] = set()  # the variables apply_env_defaults() set (the rest were the user's)


@dataclass(frozen=True)
class EnvDefault:
    name: str
    value: str
    reason: str


def host_accelerator(root: str = "/", environ: MutableMapping[str, str] | None = None) -> str | None:
    """"npu" (Ascend), "dcu" (Hygon) or None, from files and variables only; `root` simulates a host."""
    environ = os.environ if environ is None else environ
    base = Path(root)
    if (any(environ.get(v) for v in ASCEND_VARS) or glob.glob(str(base / "dev/davinci[0-9]*"))
            or any((base / p).exists() for p in ASCEND_PATHS) or (root == "/" and shutil.which("npu-smi"))):
        return "npu"
    if (any(environ.get(v) for v in DCU_VARS) or any((base / p).exists() for p in DCU_PATHS)
            or (root == "/" and shutil.which("hy-smi"))):
        return "dcu"
    return None


def dist_timeout_s(raw: str | None) -> float:
    """PORTACHAT_DIST_TIMEOUT in seconds, the default when unset or not a positive number (policy's
    decide_dist_timeout refuses a bad value with its message later; here it only sizes HCCL's timeouts)."""
    try:
        seconds = float(raw) if raw and raw.strip() else DEFAULT_DIST_TIMEOUT_S
    except ValueError:
        return DEFAULT_DIST_TIMEOUT_S
    return seconds if 0 < seconds < float("inf") else DEFAULT_DIST_TIMEOUT_S


def _clamp(value: float, bounds: tuple[int, int]) -> str:
    return str(int(min(max(value, bounds[0]), bounds[1])))


def npu_env_defaults(kind: str | None, timeout_s: float) -> tuple[EnvDefault, ...]:
    """The Ascend runtime settings MindSpeed's launch scripts export, set for the user unless they set them.
    HCCL's own timeouts follow the collective timeout, within the ranges CANN documents. None elsewhere
    (dcu_env_defaults() has the DCU's)."""
    if kind != "npu":
        return ()
    return (
        EnvDefault("PYTORCH_NPU_ALLOC_CONF", "expandable_segments:True",
                   _("the NPU caching allocator grows segments instead of fragmenting (fewer out-of-memory errors)")),
        EnvDefault("TASK_QUEUE_ENABLE", "2", _("torch_npu's level-2 task queue: operators are dispatched off the "
                                               "Python thread")),
        EnvDefault("CPU_AFFINITY_CONF", "1", _("each rank's host threads are bound to the CPU cores next to its NPU")),
        EnvDefault("HCCL_CONNECT_TIMEOUT", _clamp(timeout_s, HCCL_CONNECT_RANGE),
                   _("HCCL waits this long for every rank to connect (its default 120 s is shorter than rank-0-only "
                     "preparation); follows the collective timeout")),
        EnvDefault("HCCL_EXEC_TIMEOUT", _clamp(timeout_s, HCCL_EXEC_RANGE),
                   _("a collective waits this long for the slowest rank; follows the collective timeout")),
    )


def dcu_env_defaults(kind: str | None) -> tuple[EnvDefault, ...]:
    """The settings Hygon's own training scripts export on every DCU run, set unless the user set them.
    Source: HYGON-AI/Megatron-LM-das requirements/env.sh (the block marked "should not be modified") and the
    "default env" of its examples/*/train_*.sh (e.g. examples/qwen/train_qwen3_0.6B.sh). Left out: its
    NCCL_*CHANNELS/NCCL_ALGO (tuned for 8-card Megatron nodes and their message sizes), IB/socket names
    (per machine), OMP_NUM_THREADS=1 (torchrun sets it for multi-process runs already)."""
    if kind != "dcu":
        return ()
    return (
        # Megatron-LM-das requirements/env.sh and every examples/*/train_*.sh
        EnvDefault("HSA_FORCE_FINE_GRAIN_PCIE", "1",
                   _("DCU memory shared over PCIe is fine-grained, so RCCL moves data between cards directly "
                     "(Hygon's setting for every multi-card run)")),
        # Megatron-LM-das examples/*/train_*.sh "default env" (HIP's own default is 4)
        EnvDefault("GPU_MAX_HW_QUEUES", "10",
                   _("the HIP runtime gives streams up to 10 hardware queues instead of 4 (Hygon's training "
                     "scripts), so compute and communication streams need not share one")),
        # Megatron-LM-das requirements/env.sh ("These variables should not be modified")
        EnvDefault("RCCL_SDMA_COPY_ENABLE", "0",
                   _("RCCL copies with compute kernels instead of the SDMA engines (Hygon's fixed setting for "
                     "collectives on DCU)")),
    )


def runtime_env_defaults(kind: str | None, timeout_s: float) -> tuple[EnvDefault, ...]:
    """The vendor runtime's defaults for this accelerator kind ("npu", "dcu"); none elsewhere."""
    return npu_env_defaults(kind, timeout_s) + dcu_env_defaults(kind)


def runtime_kind(kind: str | None, device_type: str) -> str | None:
    """Whose runtime defaults apply before the device starts: the kind asked for, else torch's device type,
    except that a HIP build calls a DCU "cuda", so the host tells (a DTK install means a DCU)."""
    return kind or (host_accelerator() if device_type == "cuda" else device_type)


def apply_env_defaults(defaults: tuple[EnvDefault, ...], environ: MutableMapping[str, str] | None = None) -> list[dict]:
    """Set each default the user has not set (before the runtime reads it: import, first device use,
    process-group init); returns env_status()."""
    environ = os.environ if environ is None else environ
    for d in defaults:
        if d.name not in environ:
            environ[d.name] = d.value
            _SET_BY_US.add(d.name)
    return env_status(defaults, environ)


def env_status(defaults: tuple[EnvDefault, ...], environ: MutableMapping[str, str] | None = None) -> list[dict]:
    """Each default as it stands: the value in effect, and whether it is portachat's, the user's, or unset."""
    environ = os.environ if environ is None else environ
    status = []
    for d in defaults:
        value = environ.get(d.name)
        source = "unset" if value is None else "portachat" if d.name in _SET_BY_US and value == d.value else "user"
        status.append({"name": d.name, "value": value, "source": source, "default": d.value, "reason": d.reason})
    return status


def apply_early_defaults(root: str = "/", environ: MutableMapping[str, str] | None = None) -> str | None:
    """The command line's first call: on a host that looks like Ascend or a Hygon DCU, the runtime defaults
    the user has not set, before torch (and with it torch_npu or the HIP runtime) is loaded. Returns the
    accelerator recognised."""
    environ = os.environ if environ is None else environ
    kind = host_accelerator(root, environ)
    if environ.get("PORTACHAT_DEVICE", "").strip().lower() not in ("", "auto", kind or ""):
        return kind  # the user asked for another device: leave the environment alone
    apply_env_defaults(runtime_env_defaults(kind, dist_timeout_s(environ.get(DIST_TIMEOUT_ENV))), environ)
    return kind
