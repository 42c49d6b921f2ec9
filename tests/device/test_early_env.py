"""The NPU and DCU runtime defaults are decided and set before torch is imported (torch autoloads torch_npu,
which reads them then; the HIP runtime reads its own when the DCU starts), from what the host shows without
torch; a user's own values stay."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from portachat.device import early_env
from portachat.device.early_env import (
    apply_early_defaults,
    host_accelerator,
    runtime_env_defaults,
    runtime_kind,
)

ROOT = Path(__file__).resolve().parents[2]
NPU_VARS = ("PYTORCH_NPU_ALLOC_CONF", "TASK_QUEUE_ENABLE", "CPU_AFFINITY_CONF", "HCCL_CONNECT_TIMEOUT",
            "HCCL_EXEC_TIMEOUT")


def _host(tmp_path: Path, *paths: str) -> str:
    for rel in paths:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).touch()
    return str(tmp_path)


@pytest.mark.parametrize(("paths", "environ", "expected"), [
    (("dev/davinci0", "dev/davinci_manager"), {}, "npu"),
    (("usr/local/Ascend/driver/version.info",), {}, "npu"),
    ((), {"ASCEND_TOOLKIT_HOME": "/usr/local/Ascend/ascend-toolkit/latest"}, "npu"),
    (("opt/dtk/.info/version",), {}, "dcu"),
    ((), {"DTK_HOME": "/opt/dtk-24.04"}, "dcu"),
    (("dev/kfd", "dev/nvidia0"), {}, None),  # AMD or NVIDIA: nothing to set before torch
])
def test_the_host_is_recognised_without_torch(tmp_path, paths, environ, expected):
    assert host_accelerator(_host(tmp_path, *paths), environ) == expected


def test_a_simulated_ascend_host_gets_the_defaults_and_keeps_the_users(tmp_path):
    environ = {"TASK_QUEUE_ENABLE": "1", "PORTACHAT_DIST_TIMEOUT": "600"}
    assert apply_early_defaults(_host(tmp_path, "dev/davinci3"), environ) == "npu"
    assert environ["TASK_QUEUE_ENABLE"] == "1"  # the user's choice
    assert environ["PYTORCH_NPU_ALLOC_CONF"] == "expandable_segments:True" and environ["CPU_AFFINITY_CONF"] == "1"
    assert environ["HCCL_CONNECT_TIMEOUT"] == "600" and environ["HCCL_EXEC_TIMEOUT"] == "600"  # follow the timeout


def test_a_simulated_dcu_host_gets_hygons_defaults_and_keeps_the_users(tmp_path):
    environ = {"GPU_MAX_HW_QUEUES": "4"}
    assert apply_early_defaults(_host(tmp_path, "opt/dtk/.info/version", "opt/hyhal/lib/libhydmi.so"), environ) == "dcu"
    assert environ == {"GPU_MAX_HW_QUEUES": "4",  # the user's choice stays
                       "HSA_FORCE_FINE_GRAIN_PCIE": "1", "RCCL_SDMA_COPY_ENABLE": "0"}
    assert not set(NPU_VARS) & set(environ)  # and nothing of Ascend's


def test_other_hosts_and_other_devices_are_left_alone(tmp_path):
    plain: dict[str, str] = {}
    assert apply_early_defaults(_host(tmp_path), plain) is None and plain == {}
    forced_cpu = {"PORTACHAT_DEVICE": "cpu"}
    apply_early_defaults(_host(tmp_path, "dev/davinci0"), forced_cpu)
    assert not set(NPU_VARS) & set(forced_cpu)
    forced_rocm = {"PORTACHAT_DEVICE": "rocm"}
    apply_early_defaults(_host(tmp_path, "opt/dtk/.info/version"), forced_rocm)
    assert forced_rocm == {"PORTACHAT_DEVICE": "rocm"}


def test_a_hip_build_calls_a_dcu_cuda_so_the_host_tells(monkeypatch):
    """What get_device() passes to probe's hook: torch's device type, which is "cuda" on a DCU."""
    assert runtime_kind("dcu", "cuda") == "dcu" and runtime_kind(None, "npu") == "npu"
    monkeypatch.setattr(early_env, "host_accelerator", lambda root="/", environ=None: "dcu")
    assert runtime_kind(None, "cuda") == "dcu"
    monkeypatch.setattr(early_env, "host_accelerator", lambda root="/", environ=None: None)
    assert runtime_kind(None, "cuda") is None and runtime_env_defaults(None, 7200) == ()


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in NPU_VARS and k != "PORTACHAT_DEVICE"}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def test_it_runs_with_torch_unimportable():
    code = ("import sys; sys.modules['torch'] = None\n"  # `import torch` raises from here on
            "from portachat.device.early_env import apply_early_defaults\n"
            "import os; print(apply_early_defaults(), os.environ.get('TASK_QUEUE_ENABLE'))\n")
    done = _python(code, _env(ASCEND_HOME_PATH="/usr/local/Ascend/ascend-toolkit/latest"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["npu", "2"]


def test_python_m_portachat_sets_them_before_torch_is_imported():
    """What torch_npu would see: the environment at the moment `import torch` starts."""
    code = ("import os, sys, runpy, importlib.abc\n"
            "class Watch(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name == 'torch' and 'seen' not in globals():\n"
            "            globals()['seen'] = os.environ.get('PYTORCH_NPU_ALLOC_CONF')\n"
            "            print('at import torch:', seen, flush=True)\n"
            "sys.meta_path.insert(0, Watch())\n"
            "sys.argv = ['portachat', '--help']\n"
            "try:\n"
            "    runpy.run_module('portachat', run_name='__main__')\n"
            "except SystemExit:\n"
            "    pass\n"
            "print('after:', os.environ.get('PYTORCH_NPU_ALLOC_CONF'))\n")
    done = _python(code, _env(ASCEND_TOOLKIT_HOME="/usr/local/Ascend/ascend-toolkit/latest"))
    assert done.returncode == 0, done.stderr
    lines = [x for x in done.stdout.splitlines() if x.startswith(("at import torch:", "after:"))]
    assert lines and all(x.endswith("expandable_segments:True") for x in lines), lines
