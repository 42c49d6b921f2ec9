"""scripts/build_image.sh --dry-run for every target (the plan: Containerfile, base, pairs, build arguments),
its errors, and docker/entrypoint.sh's rule that `portachat serve` in a container needs an API key."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import choose_torch

REPO = Path(__file__).resolve().parents[2]
TARGETS = ("cpu", "cuda", "rocm", "dcu", "ascend")


def build_image(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "scripts/build_image.sh", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env=env)


def plan(done: subprocess.CompletedProcess) -> tuple[str, dict[str, str]]:
    """The Containerfile and the build arguments a dry run prints."""
    assert done.returncode == 0, done.stderr
    file = re.search(r"^\[image\] target: \w+ \((\S+)\)$", done.stdout, re.M).group(1)
    args = dict(line.split(": ", 1)[1].split("=", 1) for line in done.stdout.splitlines()
                if line.startswith("[image] build arg: "))
    return file, args


def containerfile_args(path: str) -> dict[str, str]:
    """ARG NAME=default of a Containerfile (quotes removed)."""
    text = (REPO / path).read_text()
    return {m.group(1): m.group(2).strip('"') for m in re.finditer(r"^ARG (\w+)=(.*)$", text, re.M)}


@pytest.mark.parametrize("target", TARGETS)
def test_dry_run_plans_every_target_with_the_containerfile_defaults(target):
    done = build_image(target, "--dry-run")
    file, args = plan(done)
    defaults = containerfile_args(file)
    # every build argument is one the Containerfile declares, and the plan for the default base is the
    # Containerfile's own defaults: building without the script gives the same image
    assert set(args) <= set(defaults), (args, defaults)
    if target != "dcu":  # Hygon shares the ROCm file; its base is passed
        assert args == {k: defaults[k] for k in args}
    assert f"[image] base: {args['BASE']} (the default)" in done.stdout
    assert args["TORCH_VERSION"], "every image's label names its torch"
    text = (REPO / file).read_text()
    assert 'io.portachat.torch="${TORCH_VERSION}"' in text
    assert f"-f {file} " in done.stdout and f"-t portachat:{target}" in done.stdout


def test_ascend_pairs_come_from_the_matching_table():
    for base, cann in (("quay.io/ascend/cann:9.0.0-910b-ubuntu22.04-py3.11", "9.0.0"),
                       ("quay.io/ascend/cann:8.5.0-a3-openeuler24.03-py3.11", "8.5.0"),
                       ("registry.example/cann-custom:latest --cann 9.1.0", "9.1.0")):
        image, *extra = base.split()
        _, args = plan(build_image("ascend", "--base", image, *extra, "--dry-run"))
        assert args["CANN_VERSION"] == cann
        row = dict(choose_torch.ASCEND_TABLE)[cann]
        fitting = [p for p in row if choose_torch._release(p[0]) >= choose_torch._release(choose_torch.torch_floor())]
        assert (args["TORCH_VERSION"], args["TORCH_NPU_VERSION"]) == fitting[0]  # the newest pair at the floor


def test_ascend_refuses_a_cann_below_the_floor_and_one_it_cannot_read():
    old = build_image("ascend", "--base", "quay.io/ascend/cann:8.0.rc3-910b-ubuntu22.04-py3.10", "--dry-run")
    assert old.returncode == 2 and "torch>=" in old.stderr and "CANN" in old.stderr
    _, floor = plan(build_image("ascend", "--base", "quay.io/ascend/cann:8.2.rc1-910b-ubuntu22.04-py3.10", "--dry-run"))
    assert floor["TORCH_VERSION"] == "2.6.0"  # the oldest CANN whose torch is at portachat's floor still builds
    unknown = build_image("ascend", "--base", "registry.example/cann-custom:latest", "--dry-run")
    assert unknown.returncode == 2 and "--cann" in unknown.stderr


def test_rocm_and_dcu_read_their_versions_from_the_base_tag():
    _, rocm = plan(build_image("rocm", "--base", "rocm/pytorch:rocm6.4_ubuntu24.04_py3.12_pytorch_release_2.9.0",
                               "--dry-run"))
    assert (rocm["ROCM_VERSION"], rocm["TORCH_VERSION"]) == ("6.4", "2.9.0")
    assert rocm["PORTACHAT_TORCH_INDEX"].endswith("/rocm6.4")
    file, dcu = plan(build_image("dcu", "--base", "hub.example/pytorch:2.9.1-ubuntu22.04-dtk25.04.3-py3.10",
                                 "--dry-run"))
    assert file == "docker/rocm.Containerfile" and (dcu["DTK_VERSION"], dcu["TORCH_VERSION"]) == ("25.04.3", "2.9.1")


def test_bad_target_and_missing_engine_fail_clearly(tmp_path):
    bad = build_image("tpu", "--dry-run")
    assert bad.returncode == 2 and "valid: cpu, cuda, rocm, dcu, ascend" in bad.stderr
    # a PATH with the shell and Python but no podman or docker
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "sed"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    (bin_dir / "python3").symlink_to(os.path.realpath(sys.executable))
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    dry = build_image("cpu", "--dry-run", env=env)
    assert dry.returncode == 0 and "[image] engine: none found" in dry.stdout
    real = build_image("cpu", env=env)
    assert real.returncode == 2 and "no container engine" in real.stderr and "podman" in real.stderr
    assert build_image("--help").stdout.count("TARGET") >= 2


def entrypoint(tmp_path: Path, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """docker/entrypoint.sh with a stand-in `portachat` on PATH that prints the arguments it got."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "portachat"
    fake.write_text('#!/bin/sh\necho "portachat $*"\n')
    fake.chmod(0o755)
    return subprocess.run(["sh", str(REPO / "docker/entrypoint.sh"), *args], capture_output=True, text=True,
                          timeout=30, env={"PATH": f"{bin_dir}:/usr/bin:/bin", **env})


def test_serve_in_the_container_binds_every_interface_and_requires_a_key(tmp_path):
    refused = entrypoint(tmp_path, ["portachat", "serve", "--model", "m.gguf"], {})
    assert refused.returncode == 2 and "PORTACHAT_API_KEY" in refused.stderr and "API 密钥" in refused.stderr
    served = entrypoint(tmp_path, ["portachat", "serve", "--model", "m.gguf"], {"PORTACHAT_API_KEY": "k"})
    assert served.stdout.split() == ["portachat", "serve", "--port", "8000", "--host", "0.0.0.0", "--model", "m.gguf"]
    mine = entrypoint(tmp_path, ["portachat", "serve", "--host", "127.0.0.1", "--port=9", "--api-key", "k"],
                      {"PORTACHAT_PORT": "7000"})
    assert mine.stdout.split() == ["portachat", "serve", "--host", "127.0.0.1", "--port=9", "--api-key", "k"]
    other = entrypoint(tmp_path, ["portachat", "doctor"], {})
    assert other.returncode == 0 and other.stdout.split() == ["portachat", "doctor"]


@pytest.mark.skipif(os.name != "posix", reason="POSIX shell scripts")
def test_the_image_scripts_are_valid_shell():
    for script in ("docker/system.sh", "docker/install.sh", "docker/entrypoint.sh", "scripts/build_image.sh"):
        shell = "bash" if script.endswith("build_image.sh") else "sh"
        done = subprocess.run([shell, "-n", str(REPO / script)], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, (script, done.stderr)
