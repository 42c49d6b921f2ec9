"""The torch build setup chooses stays: the constraints file it writes, and pip's own resolver honouring it."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("choose_torch", ROOT / "scripts" / "choose_torch.py")
choose_torch = importlib.util.module_from_spec(_spec)
sys.modules["choose_torch"] = choose_torch  # dataclasses look their module up by name
_spec.loader.exec_module(choose_torch)


def test_ascend_table_is_newest_first():
    keys = [choose_torch._cann_key(row) for row, _pairs in choose_torch.ASCEND_TABLE]
    assert keys == sorted(keys, reverse=True)
    for _row, pairs in choose_torch.ASCEND_TABLE:
        torches = [choose_torch._release(t) for t, _npu in pairs]
        assert torches == sorted(torches, reverse=True)
        assert all(npu.startswith(t) for t, npu in pairs)  # torch_npu X.Y.Z[.postN] is built for torch X.Y.Z


def test_floor_comes_from_pyproject():
    assert choose_torch.torch_floor(str(ROOT)) == "2.6"
    assert choose_torch.oldest_cann_for("2.6") == "8.2.RC1"
    assert choose_torch.oldest_cann_for("2.9") == "8.5.0"
    assert choose_torch.oldest_cann_for("2.11") == "9.1.0"


def test_pins_hold_what_is_installed(tmp_path):
    path = tmp_path / "constraints.txt"
    assert choose_torch.pin_installed(str(path), sys.executable) is None
    held = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    assert f"torch=={importlib.metadata.version('torch')}" in held
    companions = choose_torch.companion_pins(importlib.metadata.version("torch"))  # e.g. torchao's range on torch 2.6
    assert all(line.split("==")[0] in choose_torch.PINNED_PACKAGES or line in companions for line in held)
    assert set(companions) <= set(held)


def test_torch_below_the_floor_is_refused(tmp_path):
    path = tmp_path / "constraints.txt"
    error = choose_torch.pin_installed(str(path), sys.executable, floor="99.0")
    assert error and "needs torch>=99.0" in error and "scripts/setup.sh" in error
    assert not path.exists()


def _resolve(tmp_path: Path, name: str, *extra: str) -> dict:
    """pip's resolver asked to upgrade torch (what a dependency wanting a newer torch does), report only."""
    report = tmp_path / f"{name}.json"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--upgrade", "--report", str(report),
           *extra, "torch>=2.9"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env={**os.environ, "PIP_NO_INPUT": "1"})
    if done.returncode != 0 and ("NewConnectionError" in done.stderr or "No matching distribution" in done.stderr):
        pytest.skip(f"no package index reachable: {done.stderr.strip()[-300:]}")
    assert done.returncode == 0, done.stderr
    return json.loads(report.read_text())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_pip_resolver_keeps_the_pinned_torch(tmp_path):
    constraints = tmp_path / "portachat-constraints.txt"
    assert choose_torch.pin_installed(str(constraints), sys.executable) is None
    installed = importlib.metadata.version("torch")

    held = _resolve(tmp_path, "held", "-c", str(constraints))
    torches = [item["metadata"]["version"] for item in held["install"] if item["metadata"]["name"] == "torch"]
    assert torches in ([], [installed]), f"pip would replace torch {installed} with {torches}"

    # Without the file the same request replaces torch: the constraint is what keeps it.
    free = _resolve(tmp_path, "free")
    replaced = [item["metadata"]["version"] for item in free["install"] if item["metadata"]["name"] == "torch"]
    if not replaced:
        pytest.skip(f"the index offers no torch other than the installed {installed}; nothing to hold against")
    assert replaced[0] != installed


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "choose_torch.py"), *args], capture_output=True,
                          text=True, timeout=60, env=env)


def test_setup_writes_the_plan_pins_before_installing(tmp_path):
    """What setup.sh runs first: the pair goes into the constraints file before torch_npu's own install."""
    root = tmp_path / "root"
    info = root / "usr/local/Ascend/ascend-toolkit/latest/x86_64-linux/ascend_toolkit_install.info"
    info.parent.mkdir(parents=True)
    info.write_text("version=9.0.0\n")
    (root / "dev").mkdir()
    (root / "dev" / "davinci0").write_text("")
    env = {"PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": os.devnull}
    pins = tmp_path / "constraints.txt"
    done = _cli("--root", str(root), "--pins-file", str(pins), env=env)
    assert done.returncode == 0, done.stderr
    assert [line for line in pins.read_text().splitlines() if not line.startswith("#")] == \
        ["torch==2.10.0", "torch_npu==2.10.0"]
    info.write_text("version=8.1.RC1\n")  # a stop (its newest torch, 2.5.1, is below the floor) writes nothing
    pins.unlink()
    assert _cli("--root", str(root), "--pins-file", str(pins), env=env).returncode == 2 and not pins.exists()


def test_setup_holds_the_installed_build(tmp_path):
    pins = tmp_path / "constraints.txt"
    done = _cli("--python", sys.executable, "--pin-installed", str(pins))
    assert done.returncode == 0, done.stderr
    assert f"holding torch=={importlib.metadata.version('torch')}" in done.stderr


@pytest.mark.parametrize(("cann", "torch_version", "torch_npu"), [
    ("8.2.RC1", "2.6.0", "2.6.0"), ("8.3.RC1", "2.8.0", "2.8.0"), ("8.5.0", "2.9.0", "2.9.0"),
    ("9.0.0", "2.10.0", "2.10.0"), ("9.1.0", "2.12.0", "2.12.0"),
])
def test_910b_hosts_on_cann_8_2_and_8_3_can_install(cann, torch_version, torch_npu):
    """The floor in pyproject.toml is what the code needs, so CANN 8.2/8.3 hosts (torch_npu 2.6 / 2.7.1 / 2.8)
    get a pair instead of a stop; newer CANN still get their newest torch."""
    choice = choose_torch.ascend_choice(cann, choose_torch.torch_floor(str(ROOT)))
    assert (choice.torch, choice.torch_npu) == (torch_version, torch_npu)
    plan = choose_torch.Plan("ascend")
    choose_torch.plan_ascend(plan, cann)
    assert plan.stop is None and any(f"torch=={torch_version}" in " ".join(args) for args in plan.installs)


def test_old_torch_holds_a_torchao_that_imports_with_it():
    """torchao 0.17+ fails to import on torch 2.6 (and takes `transformers` model loading with it); 0.15/0.16
    import and have the int4 option portachat's quant path uses. torch >= 2.7 gets no hold."""
    assert choose_torch.companion_pins("2.6.0+cu124") == ["torchao>=0.15,<0.17"]
    assert choose_torch.companion_pins("2.6.0") == choose_torch.companion_pins("2.6.0.post3")
    assert choose_torch.companion_pins("2.7.1") == [] and choose_torch.companion_pins("2.13.0+cpu") == []
    plan = choose_torch.Plan("ascend")
    choose_torch.plan_ascend(plan, "8.2.RC1")  # CANN 8.2's torch is 2.6.0: the hold goes in before any install
    assert choose_torch.plan_pins(plan) == ["torch==2.6.0", "torch_npu==2.6.0", "torchao>=0.15,<0.17"]
    plan = choose_torch.Plan("ascend")
    choose_torch.plan_ascend(plan, "8.3.RC1")
    assert not any(p.startswith("torchao") for p in choose_torch.plan_pins(plan))
    assert "torchao>=0.15,<0.17" in choose_torch.explain(choose_torch.Plan("ascend", installs=[["torch==2.6.0"]]))


def test_setup_says_it_holds_torchao_for_an_installed_old_torch(tmp_path):
    """After install: the environment's torch is 2.6 (a stand-in interpreter answering the metadata query),
    so the constraints file holds torchao and setup's output says why."""
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho \'{"torch": "2.6.0+cpu", "torch_npu": "2.6.0"}\'\n')
    fake.chmod(0o755)
    pins = tmp_path / "constraints.txt"
    done = _cli("--python", str(fake), "--pin-installed", str(pins))
    assert done.returncode == 0, done.stderr
    held = [line for line in pins.read_text().splitlines() if not line.startswith("#")]
    assert held == ["torch==2.6.0+cpu", "torch_npu==2.6.0", "torchao>=0.15,<0.17"]
    assert "note: holding torchao>=0.15,<0.17 for torch 2.6.0+cpu" in done.stderr
