"""The CPU image, built here and run: docker/cpu.Containerfile FROM a debootstrapped Debian base, built by
scripts/build_image.sh with podman, then `portachat serve` started from the image's filesystem (podman image
mount + bubblewrap, as `podman run` cannot start containers on this VM) with SmolLM2, asked through the
openai client.

Fast on a rerun: the debootstrapped base is kept as a tarball and as an imported image, podman keeps the
build's layers, and pip inside the build reads this machine's wheels and local indexes (its pip settings,
mounted into the build) and a kept pip cache. Everything lives under $PORTACHAT_IMAGE_TEST_CACHE
(default ~/.cache/portachat/image-test). Needs root (podman, debootstrap, mounts); installs podman,
buildah and debootstrap with apt when they are missing and it can.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import httpx
import openai
import pytest

from scripts import choose_torch
from tests.serve.api_testing import free_port
from tests.smollm2 import smollm2_gguf_path

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("PORTACHAT_IMAGE_TEST_CACHE", Path.home() / ".cache" / "portachat" / "image-test"))
SUITE = "bookworm"  # docker/cpu.Containerfile's default base is Debian bookworm too
# What the image needs from the system, in the base already: the build then installs nothing with apt.
INCLUDE = ("python3", "python3-venv", "bubblewrap", "gcc", "libc6-dev", "ca-certificates", "passwd")
BASE_KEY = hashlib.sha256(f"{SUITE} minbase {','.join(INCLUDE)}".encode()).hexdigest()[:12]
BASE_TAG = f"localhost/portachat-test-base:{SUITE}-{BASE_KEY}"
IMAGE_TAG = "localhost/portachat-test:cpu"
TOOLS = {"podman": "podman", "buildah": "buildah", "debootstrap": "debootstrap", "bwrap": "bubblewrap"}
API_KEY = "image-test-key"


def run(args: list[str], timeout: float = 1200, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(args[:4])} ... failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                             f"{done.stderr[-3000:]}")
    return done


def ensure_tools() -> None:
    missing = [pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip(f"{', '.join(missing)} missing and not installable here (needs root and apt-get): "
                    f"apt-get install {' '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
    if subprocess.run(install, env=env, capture_output=True, timeout=900).returncode != 0:
        run(["apt-get", "update", "-q"], timeout=600)
        run(install, env=env, timeout=900)


def ensure_base() -> None:
    """The debootstrapped base as a podman image, from the kept tarball when there is one."""
    if subprocess.run(["podman", "image", "exists", BASE_TAG]).returncode == 0:
        return
    CACHE.mkdir(parents=True, exist_ok=True)
    tarball = CACHE / f"debian-{SUITE}-{BASE_KEY}.tar"
    if not tarball.exists():
        rootfs = CACHE / f"rootfs-{BASE_KEY}"
        shutil.rmtree(rootfs, ignore_errors=True)
        run(["debootstrap", "--variant=minbase", f"--include={','.join(INCLUDE)}", SUITE, str(rootfs),
             "http://deb.debian.org/debian"], timeout=1200)
        shutil.rmtree(rootfs / "var/cache/apt/archives", ignore_errors=True)
        (rootfs / "var/cache/apt/archives/partial").mkdir(parents=True)
        partial = tarball.with_suffix(".partial")
        with tarfile.open(partial, "w") as tar:
            tar.add(rootfs, arcname=".")
        partial.rename(tarball)
        shutil.rmtree(rootfs)
    run(["podman", "import", "--change", "CMD=/bin/bash", str(tarball), BASE_TAG])


def pip_mounts(tmp: Path) -> list[str]:
    """-v arguments giving the build this machine's pip settings (as /etc/pip.conf), the local wheel
    directories and indexes they name, and a kept pip cache for the image's user."""
    listed = run([sys.executable, "-m", "pip", "config", "list"]).stdout.splitlines()
    settings: dict[str, str] = {}
    for line in listed:  # e.g. global.find-links='/opt/wheels' or :env:.find-links='/opt/wheels'
        key, _, value = line.partition("=")
        name = key.rsplit(".", 1)[-1]
        if name in ("find-links", "index-url", "extra-index-url", "cert"):
            settings[name] = value.strip("'\"")
    conf = tmp / "pip.conf"
    conf.write_text("[global]\n" + "".join(f"{k} = {v}\n" for k, v in settings.items()))
    mounts = ["-v", f"{conf}:/etc/pip.conf:ro"]
    if os.path.isfile(settings.get("cert", "")):  # the CA bundle this machine's HTTPS to PyPI needs
        mounts += ["-v", f"{settings['cert']}:{settings['cert']}:ro"]
    for name, value in settings.items():
        if name == "cert":
            continue
        for location in value.split():
            path = Path(location.removeprefix("file://"))
            if path.is_absolute() and path.is_dir():
                # an index's pages link to files beside its simple/ directory
                top = path.parent if path.name == "simple" else path
                if f"{top}:{top}:ro" not in mounts:
                    mounts += ["-v", f"{top}:{top}:ro"]
    cache = CACHE / "pip-cache"
    cache.mkdir(parents=True, exist_ok=True)
    os.chown(cache, 10001, 10001)  # docker/system.sh's portachat user
    return mounts + ["-v", f"{cache}:/home/portachat/.cache/pip"]


def report(config: pytest.Config, line: str) -> None:
    """A line on the terminal whether or not output is captured (CI's log shows the image's size)."""
    reporter = config.pluginmanager.getplugin("terminalreporter")
    capture = config.pluginmanager.getplugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"[image] {line}")


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def sandbox(rootfs: str, config: dict, data: Path, args: list[str], env: dict[str, str]) -> list[str]:
    """bubblewrap standing in for `podman run --read-only`: the image's filesystem (read-only, a tmpfs on
    /tmp), its environment, working directory and user, /data bound as the volume, the host's network."""
    passwd = (Path(rootfs) / "etc/passwd").read_text().splitlines()
    user = config.get("User") or "root"
    uid, gid = next(line.split(":")[2:4] for line in passwd if line.split(":")[0] == user)
    cmd = ["bwrap", "--ro-bind", rootfs, "/", "--dev", "/dev", "--proc", "/proc",
           "--perms", "1777", "--tmpfs", "/tmp", "--bind", str(data), "/data", "--unshare-pid", "--unshare-ipc",
           "--die-with-parent", "--clearenv", "--chdir", config.get("WorkingDir") or "/"]
    for item in config.get("Env") or []:
        key, _, value = item.partition("=")
        cmd += ["--setenv", key, value]
    for key, value in env.items():
        cmd += ["--setenv", key, value]
    return cmd + ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--init-groups", *config["Entrypoint"], *args]


@pytest.fixture(scope="module")
def image(tmp_path_factory, pytestconfig):
    if os.geteuid() != 0:
        pytest.skip("building and mounting images here needs root (podman image mount, debootstrap)")
    ensure_tools()
    started = time.monotonic()
    ensure_base()
    based = time.monotonic()
    before = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", IMAGE_TAG], capture_output=True,
                            text=True).stdout.strip()
    build = ["bash", "scripts/build_image.sh", "cpu", "--base", BASE_TAG, "--tag", IMAGE_TAG, "--",
             # chroot: this VM's crun cannot start containers; the local wheels instead of the CPU index
             "--isolation", "chroot", "--build-arg", "PORTACHAT_TORCH_INDEX=",
             *pip_mounts(tmp_path_factory.mktemp("pip"))]
    run(build, cwd=REPO, timeout=1500)
    built = time.monotonic()
    info = json.loads(run(["podman", "image", "inspect", IMAGE_TAG]).stdout)[0]
    if before and before != info["Id"]:  # the previous build of this tag, now untagged: 2 GB not to keep
        subprocess.run(["podman", "image", "rm", before], capture_output=True, timeout=300)
    report(pytestconfig, f"base {based - started:.0f} s, build {built - based:.0f} s; {IMAGE_TAG}: "
                         f"{info['Size'] / 2**20:.0f} MiB")
    rootfs = run(["podman", "image", "mount", IMAGE_TAG]).stdout.strip()
    try:
        yield rootfs, info
    finally:
        subprocess.run(["podman", "image", "unmount", IMAGE_TAG], capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def server(image, tmp_path_factory, pytestconfig):
    rootfs, info = image
    config = info["Config"]
    data = tmp_path_factory.mktemp("data")
    (data / "models").mkdir()
    shutil.copyfile(smollm2_gguf_path(), data / "models" / "smol.gguf")
    for path in (data, data / "models", data / "models" / "smol.gguf"):
        os.chown(path, 10001, 10001)
    port = free_port()
    args = ["portachat", "serve", "--model", "/data/models/smol.gguf", "--served-model-name", "smol",
            "--max-model-len", "1024", "--kv-cache-gb", "0.5", "--log-level", "warning"]
    env = {"PORTACHAT_PORT": str(port), "OMP_NUM_THREADS": "2", "PORTACHAT_API_KEY": API_KEY}
    started = time.monotonic()
    log = data.parent / "serve.log"  # a file, not a pipe nobody drains while it runs
    with open(log, "w") as err:
        proc = subprocess.Popen(sandbox(rootfs, config, data, args, env), stdout=subprocess.DEVNULL, stderr=err)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while not healthy(url):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait(30)
            pytest.fail(f"the image's server did not come up: {log.read_text()[-3000:]}")
        time.sleep(0.2)
    report(pytestconfig, f"portachat serve in the image healthy {time.monotonic() - started:.0f} s after start")
    yield url, rootfs, info, data, port
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)


def test_image_labels_torch_and_runs_as_its_user(image):
    _, info = image
    labels = info["Config"]["Labels"]
    assert labels["io.portachat.torch"] == choose_torch.TORCH_VERSION
    assert info["Config"]["User"] == "portachat"
    assert "portachat" in info["Config"]["Cmd"] and "serve" in info["Config"]["Cmd"]
    assert "PORTACHAT_HOME=/data" in info["Config"]["Env"]
    assert "/data" in info["Config"]["Volumes"]


def test_serve_in_the_image_answers_through_the_openai_client(server):
    url, *_ = server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=300)
    reply = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "What is the capital of France?"}], max_tokens=24,
        temperature=0)
    assert "Paris" in reply.choices[0].message.content
    # bound to 0.0.0.0 inside, so the key is required
    assert httpx.get(f"{url}/v1/models", timeout=30).status_code == 401


def test_the_image_health_check_passes_and_serve_without_a_key_stops(server):
    url, rootfs, info, data, port = server
    config = info["Config"]
    check = info["Healthcheck"]["Test"]  # podman lists it beside Config
    assert check[0] == "CMD", check
    bare = {**config, "Entrypoint": []}
    health = subprocess.run(sandbox(rootfs, bare, data, check[1:], {"PORTACHAT_PORT": str(port)}),
                            capture_output=True, text=True, timeout=120)
    assert health.returncode == 0, health.stderr
    refused = subprocess.run(sandbox(rootfs, config, data, ["portachat", "serve"], {}),
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "PORTACHAT_API_KEY" in refused.stderr, refused.stderr
