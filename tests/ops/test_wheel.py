"""A non-editable install builds and loads the C kernels: the wheel carries kernels/*.c and *.h
(pyproject's package-data), and the package as installed, not this checkout, compiles them into a
fresh cache and passes the interface check."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from portachat.ops import cpu_kernels

REPO = Path(__file__).resolve().parents[2]

# Runs in the fresh venv from an empty directory: prints where portachat came from and the build.
CHECK = """
import portachat
from portachat.ops import cpu_kernels as ck
lib = ck.library()
print(portachat.__file__)
print(ck.library_path())
print(lib is not None and ck.abi_differences(lib) == [])
"""


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, **kwargs)
    assert done.returncode == 0, f"{command}: {done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done


@pytest.mark.slow
def test_the_wheel_installs_builds_and_loads_the_kernels(tmp_path):
    if cpu_kernels.compiler() is None:
        pytest.skip("no C compiler: nothing to build")
    # Built from a copy, so the checkout gets no build/ or egg-info; setuptools from this venv, offline.
    source = tmp_path / "source"
    shutil.copytree(REPO / "portachat", source / "portachat", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    wheels = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip"]
    offline = ["--no-deps", "--no-index", "-q"]
    _run([*pip, "wheel", *offline, "--no-build-isolation", "-w", str(wheels), str(source)])
    (wheel,) = wheels.glob("portachat-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in (*cpu_kernels.SOURCES, *cpu_kernels.HEADERS):
        assert f"portachat/ops/kernels/{path.name}" in names

    # A fresh venv whose only portachat is the wheel; torch and the rest come from this venv's
    # site-packages as a plain path (its .pth files, this checkout's editable install among them, are
    # not run there).
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = Path(_run([str(python), "-c", purelib]).stdout.strip())
    (site / "outer.pth").write_text(sysconfig.get_path("purelib") + "\n")
    _run([*pip, "--python", str(python), "install", *offline, str(wheel)])

    cwd, cache = tmp_path / "elsewhere", tmp_path / "cache"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PORTACHAT_KERNEL_CACHE")}
    env |= {"XDG_CACHE_HOME": str(cache), "PORTACHAT_CPU_KERNELS": "1"}
    done = _run([str(python), "-c", CHECK], cwd=cwd, env=env)
    installed_at, library, loaded = done.stdout.strip().splitlines()[-3:]
    assert Path(installed_at).is_relative_to(site), installed_at  # the wheel's package, not the checkout
    assert Path(library).is_relative_to(cache) and Path(library).exists()  # compiled now, from the wheel
    assert loaded == "True", done.stderr
