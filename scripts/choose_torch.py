"""Decide which torch build to install, BEFORE torch exists (stdlib only; run by scripts/setup.sh).

What the machine shows decides: NVIDIA driver tools, ROCm tools, Hygon DTK, Ascend npu-smi / CANN,
Intel GPU tools; nothing found means CPU. Output: the reasons on stderr, then on stdout one line per
`pip install` to run (shell-quoted arguments). Exit 2 with instructions when no safe choice exists.

Overrides win, in this order: PORTACHAT_TORCH_SPEC (what to install, e.g. a wheel path or
"torch==2.7.1"), PORTACHAT_TORCH_INDEX (the index to install it from), pip's own settings
(PIP_INDEX_URL, or an index-url in pip.conf) and local wheels pip already finds (PIP_FIND_LINKS /
find-links): those are used as they are.

    python3 scripts/choose_torch.py            # what setup.sh runs
    python3 scripts/choose_torch.py --explain  # the reasons only

The chosen build is held: setup.sh passes a pip constraints file (.venv/portachat-constraints.txt, the
plan's torch/torch_npu pins, then `--pin-installed` with the exact installed torch, torch_npu,
torchvision, torchaudio) as -c to every pip install, so no later dependency replaces torch; an old torch
also holds the packages whose newest release needs a newer one (TORCH_COMPANIONS: torchao below torch 2.7).
"""

from __future__ import annotations

import argparse
import configparser
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

TORCH_VERSION = "2.13.0"  # the default torch; keep in step with pyproject.toml's pin
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
XPU_INDEX = "https://download.pytorch.org/whl/xpu"
ROCM_INDEX = "https://download.pytorch.org/whl/rocm{}"
ROCM_WHEEL_VERSIONS = ("6.3", "6.4", "7.0", "7.1")  # ROCm versions with published torch wheels, oldest first
# Ascend's published matching table (Ascend/pytorch COMPATIBILITY.md and README, "TorchNPU version
# matching"; the versions are torch-npu's releases on PyPI): CANN -> ((torch, torch_npu), ...), newest CANN
# first, newest torch first within a CANN. The older torch of each CANN are Ascend's back-ports.
# "9.1.X" is TorchNPU 26.1.1, published for the CANN 9.1 releases after 9.1.0.
ASCEND_TABLE: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("9.1.X", (("2.12.0", "2.12.0.post2"), ("2.11.0", "2.11.0.post2"), ("2.10.0", "2.10.0.post6"),
               ("2.9.0", "2.9.0.post8"), ("2.7.1", "2.7.1.post10"))),
    ("9.1.0", (("2.12.0", "2.12.0"), ("2.11.0", "2.11.0"), ("2.10.0", "2.10.0.post4"), ("2.9.0", "2.9.0.post6"),
               ("2.7.1", "2.7.1.post8"))),
    ("9.0.0", (("2.10.0", "2.10.0"), ("2.9.0", "2.9.0.post2"), ("2.8.0", "2.8.0.post4"), ("2.7.1", "2.7.1.post4"))),
    ("8.5.0", (("2.9.0", "2.9.0"), ("2.8.0", "2.8.0.post2"), ("2.7.1", "2.7.1.post2"), ("2.6.0", "2.6.0.post5"))),
    ("8.3.RC1", (("2.8.0", "2.8.0"), ("2.7.1", "2.7.1"), ("2.6.0", "2.6.0.post3"), ("2.1.0", "2.1.0.post17"))),
    ("8.2.RC1", (("2.6.0", "2.6.0"), ("2.5.1", "2.5.1.post1"), ("2.1.0", "2.1.0.post13"))),
    ("8.1.RC1", (("2.5.1", "2.5.1"), ("2.4.0", "2.4.0.post4"), ("2.3.1", "2.3.1.post6"), ("2.1.0", "2.1.0.post12"))),
    ("8.0.0", (("2.4.0", "2.4.0.post2"), ("2.3.1", "2.3.1.post4"), ("2.1.0", "2.1.0.post10"))),
    ("8.0.RC3", (("2.4.0", "2.4.0"), ("2.3.1", "2.3.1.post2"), ("2.1.0", "2.1.0.post8"))),
    ("8.0.RC2", (("2.3.1", "2.3.1"), ("2.2.0", "2.2.0.post2"), ("2.1.0", "2.1.0.post6"))),
    ("8.0.RC1", (("2.2.0", "2.2.0"), ("2.1.0", "2.1.0.post3"))),
)
CANN_DOWNLOAD = "https://www.hiascend.com/developer/download/community/result?module=cann"
CONSTRAINTS_FILE = ".venv/portachat-constraints.txt"
# Packages whose installed version the constraints file holds: the torch build and what is built against it.
PINNED_PACKAGES = ("torch", "torch_npu", "torchvision", "torchaudio")
# Packages built against torch whose newest release needs a newer torch than the one installed: below the
# torch version, the constraint holds them (measured with torch 2.6.0, CPU: torchao 0.17/0.18 fail to import,
# torch.utils._pytree.register_constant being torch 2.7's, and `transformers` then cannot load its model
# classes; 0.15 and 0.16 import, skip their C++ extensions, and take Int4WeightOnlyConfig(int4_packing_format=),
# which portachat's int4 path passes; 0.13 and older lack that option).
TORCH_COMPANIONS: tuple[tuple[str, str], ...] = (("2.7", "torchao>=0.15,<0.17"),)
CANN_SET_ENV = (
    "usr/local/Ascend/ascend-toolkit/set_env.sh",
    "usr/local/Ascend/cann/set_env.sh",
    "usr/local/Ascend/nnae/set_env.sh",
)


@dataclass
class Plan:
    hardware: str  # cpu | nvidia | rocm | dcu | ascend | xpu | macos
    found: list[str] = field(default_factory=list)  # what the machine showed
    reason: str = ""
    installs: list[list[str]] = field(default_factory=list)  # pip install argument lists, in order
    notes: list[str] = field(default_factory=list)
    stop: str | None = None  # set when setup must stop: what to do instead


class Machine:
    """What the filesystem and PATH show; `root` lets tests simulate another machine's files."""

    def __init__(self, root: str = "/", env: dict[str, str] | None = None) -> None:
        self.root = root
        self.env = dict(os.environ if env is None else env)

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel.lstrip("/"))

    def exists(self, rel: str) -> bool:
        return os.path.exists(self.path(rel))

    def glob(self, rel: str) -> list[str]:
        return sorted(glob.glob(self.path(rel)))

    def read(self, rel: str) -> str | None:
        try:
            with open(self.path(rel), encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return None

    def which(self, tool: str) -> str | None:
        return shutil.which(tool, path=self.env.get("PATH", ""))

    def run(self, args: list[str]) -> str:
        exe = self.which(args[0])
        if exe is None:
            return ""
        try:
            done = subprocess.run([exe, *args[1:]], capture_output=True, text=True, timeout=20, env=self.env)
        except (OSError, subprocess.SubprocessError):
            return ""
        return done.stdout if done.returncode == 0 else ""


# --- what is there ---------------------------------------------------------------------------------
def _version_in(text: str | None, pattern: str = r"(\d+\.\d+(?:\.[\w]+)?)") -> str | None:
    m = re.search(pattern, text or "")
    return m.group(1) if m else None


def cann_version(m: Machine) -> str | None:
    roots = [m.env.get("ASCEND_TOOLKIT_HOME"), m.env.get("ASCEND_HOME_PATH"),
             "/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/cann"]
    for root in filter(None, roots):
        for name in ("version.cfg", "*/ascend_toolkit_install.info", "compiler/version.info", "runtime/version.info"):
            for path in glob.glob(os.path.join(m.path(root), name)):
                with open(path, encoding="utf-8", errors="replace") as f:
                    found = _version_in(f.read(), r"version=\[?([0-9][\w.]*)")
                if found:
                    return found
    return None


def torch_floor(root: str | None = None) -> str:
    """The lowest torch the project accepts: pyproject.toml's `torch>=X` (what `pip install -e .` enforces)."""
    path = os.path.join(root or os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pyproject.toml")
    try:
        with open(path, encoding="utf-8") as f:
            found = re.search(r'"torch\s*>=\s*([0-9][0-9.]*)', f.read())
    except OSError:
        found = None
    return found.group(1) if found else "2.9"


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version.split("+")[0])[:3])


@dataclass
class AscendChoice:
    cann_row: str  # the CANN row of the table the pair comes from
    torch: str | None  # None: no pair of that CANN reaches the torch floor
    torch_npu: str | None
    newest_torch: str  # the newest torch that CANN row has (shown when it is below the floor)
    newer_than_table: bool = False  # the installed CANN is newer than every row


def ascend_choice(cann: str | None, floor: str) -> AscendChoice:
    """The pair for the CANN found: its row (the newest row not newer than it), then that row's newest
    torch at or above the floor. An unknown CANN, or one newer than the table, gets the newest row."""
    key = _cann_key(cann) if cann else None
    row = ASCEND_TABLE[0]
    newer = key is not None and key[:2] > _cann_key(ASCEND_TABLE[0][0])[:2]
    if key is not None and not newer:
        row = next((r for r in ASCEND_TABLE if _cann_key(r[0]) <= key), ASCEND_TABLE[-1])
    pairs = [p for p in row[1] if _release(p[0]) >= _release(floor)]
    torch_v, npu_v = pairs[0] if pairs else (None, None)
    return AscendChoice(row[0], torch_v, npu_v, row[1][0][0], newer)


def oldest_cann_for(floor: str) -> str:
    """The oldest CANN whose published pairs include a torch at or above the floor."""
    fitting = [row for row, pairs in ASCEND_TABLE if _release(pairs[0][0]) >= _release(floor)]
    return fitting[-1]


def _cann_key(text: str) -> tuple[int, int, int, int]:
    """8.0.RC2 < 8.0.0 < 8.1.RC1: release candidates come before the release of that minor version."""
    parts = text.upper().split(".")
    major = int(parts[0]) if parts[0].isdigit() else 0
    minor = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    third = parts[2] if len(parts) > 2 else "0"
    if third == "X":  # "9.1.X": the releases after 9.1.0
        return (major, minor, 1, 1)
    rc = re.match(r"RC(\d+)", third)
    return (major, minor, 0, int(rc.group(1))) if rc else (major, minor, 1, int(third) if third.isdigit() else 0)


def rocm_version(m: Machine) -> str | None:
    for rel in ("opt/rocm/.info/version", "opt/rocm/.info/version-dev"):
        found = _version_in(m.read(rel))
        if found:
            return found
    return _version_in(m.run(["rocminfo", "--version"]))


def rocm_wheel_version(installed: str | None) -> str:
    """The newest ROCm with published torch wheels that is not newer than the installed one."""
    if installed is None:
        return ROCM_WHEEL_VERSIONS[-1]
    have = tuple(int(x) for x in re.findall(r"\d+", installed)[:2])
    fitting = [v for v in ROCM_WHEEL_VERSIONS if tuple(int(x) for x in v.split(".")) <= have]
    return fitting[-1] if fitting else ROCM_WHEEL_VERSIONS[0]


def intel_gpu(m: Machine) -> bool:
    for vendor_file in m.glob("sys/class/drm/card*/device/vendor"):
        with open(vendor_file) as f:
            if f.read().strip().lower() == "0x8086":
                class_file = os.path.join(os.path.dirname(vendor_file), "class")
                try:
                    with open(class_file) as f2:
                        if f2.read().strip().startswith("0x03"):  # display controller, not just an iGPU bridge
                            return True
                except OSError:
                    return True
    return False


def local_torch_wheels(m: Machine, find_links: list[str]) -> list[str]:
    """torch wheels in pip's find-links directories (pip uses them without asking any index)."""
    wheels: list[str] = []
    for link in find_links:
        if link.startswith("file://"):
            link = link[len("file://"):]
        if os.path.isdir(link):
            wheels += sorted(glob.glob(os.path.join(link, "torch-*.whl")))
    return wheels


def pip_config_files(m: Machine, python: str | None) -> list[str]:
    """pip's configuration files in pip's order (later ones win); PIP_CONFIG_FILE=os.devnull means none."""
    chosen = m.env.get("PIP_CONFIG_FILE")
    if chosen == os.devnull:
        return []
    home = os.path.expanduser("~")
    xdg_dirs = m.env.get("XDG_CONFIG_DIRS", "/etc/xdg").split(":")
    files = [os.path.join(d, "pip", "pip.conf") for d in xdg_dirs] + ["/etc/pip.conf"]
    files += [os.path.join(home, ".pip", "pip.conf"),
              os.path.join(m.env.get("XDG_CONFIG_HOME", os.path.join(home, ".config")), "pip", "pip.conf")]
    if python:  # the virtual environment's own pip.conf
        files.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(python))), "pip.conf"))
    if chosen:
        files.append(chosen)
    return files


def pip_settings(m: Machine, python: str | None) -> dict[str, str]:
    """index-url / extra-index-url / find-links / no-index from pip.conf files and PIP_* variables."""
    settings: dict[str, str] = {}
    names = ("index-url", "extra-index-url", "find-links", "no-index")
    for path in pip_config_files(m, python):
        parser = configparser.ConfigParser()
        try:
            parser.read(path)
        except configparser.Error:
            continue
        for section in ("global", "install"):
            for name in names:
                if parser.has_option(section, name):
                    settings[name] = " ".join(parser.get(section, name).split())
    for name in names:
        value = m.env.get("PIP_" + name.upper().replace("-", "_"))
        if value:
            settings[name] = value
    return settings


# --- the decision ----------------------------------------------------------------------------------
def detect(m: Machine) -> Plan:
    """Which hardware this is, and the evidence, before any override is applied."""
    if sys.platform == "darwin" and m.root == "/":
        return Plan("macos", ["macOS"], "macOS: the default PyPI wheel (CPU + Apple MPS, no CUDA)")
    evidence = {
        "ascend": [t for t in ("npu-smi",) if m.which(t)] + m.glob("dev/davinci[0-9]*")[:1]
        + [m.path(p) for p in CANN_SET_ENV if m.exists(p)],
        "dcu": [t for t in ("hy-smi",) if m.which(t)] + [m.path(p) for p in ("opt/dtk",) if m.exists(p)]
        + (["DTK_HOME=" + m.env["DTK_HOME"]] if m.env.get("DTK_HOME") else []),
        "nvidia": [t for t in ("nvidia-smi",) if m.which(t)]
        + [m.path(p) for p in ("proc/driver/nvidia/version",) if m.exists(p)],
        "rocm": [t for t in ("rocm-smi", "amd-smi", "rocminfo") if m.which(t)]
        + [m.path(p) for p in ("dev/kfd",) if m.exists(p)],
        "xpu": [t for t in ("xpu-smi", "sycl-ls") if m.which(t)] + (["Intel GPU in /sys/class/drm"] if intel_gpu(m) else []),
    }
    # DCU before ROCm: Hygon machines also carry ROCm-named tools and /dev/kfd.
    for hw in ("ascend", "dcu", "nvidia", "rocm", "xpu"):
        if evidence[hw]:
            return Plan(hw, [os.path.basename(e) if e.startswith(m.root) and m.root != "/" else e
                             for e in evidence[hw]])
    return Plan("cpu", ["no NVIDIA, AMD, Hygon, Ascend or Intel GPU tools or devices"])


def plan_install(m: Machine, python: str | None = None) -> Plan:
    plan = detect(m)
    spec = m.env.get("PORTACHAT_TORCH_SPEC", "").strip()
    index = m.env.get("PORTACHAT_TORCH_INDEX", "").strip()
    pip_conf = pip_settings(m, python)
    wheels = local_torch_wheels(m, pip_conf.get("find-links", "").split())
    pinned = f"torch=={TORCH_VERSION}"

    if spec or index:
        args = shlex.split(spec) if spec else [pinned]
        if index:
            args += ["--index-url", index]
        plan.reason = "override: " + " ".join(
            part for part in (f"PORTACHAT_TORCH_SPEC={spec}" if spec else "",
                              f"PORTACHAT_TORCH_INDEX={index}" if index else "") if part
        )
        plan.installs = [args]
        if plan.hardware == "ascend" and not any("torch_npu" in a or "torch-npu" in a for a in args):
            plan.notes.append("Ascend: add the matching torch_npu yourself, e.g. PORTACHAT_TORCH_SPEC='torch==X torch_npu==X'")
        return plan

    local = [w for w in wheels if fits_hardware(os.path.basename(w), plan.hardware)]
    if local:
        plan.reason = (f"{plan.hardware}: pip's find-links already holds {os.path.basename(local[0])}; "
                       "installing it as it is")
        plan.installs = [[pinned]]
        return plan
    if pip_conf.get("index-url") or pip_conf.get("no-index"):
        where = pip_conf.get("index-url") or "no index (--no-index)"
        plan.reason = f"{plan.hardware}: pip is configured to use {where}; that choice wins"
        plan.installs = [[pinned]]
        if plan.hardware == "cpu":
            plan.notes.append("if that index mirrors PyPI, a Linux torch from it is the multi-GB CUDA build; "
                              f"set PORTACHAT_TORCH_INDEX={CPU_INDEX} for the CPU build")
        return plan

    if plan.hardware == "cpu":
        plan.reason = ("CPU only: the PyTorch CPU wheels (a plain `pip install torch` on Linux pulls a "
                       "multi-GB CUDA build)")
        plan.installs = [[pinned, "--index-url", CPU_INDEX]]
    elif plan.hardware == "macos":
        plan.installs = [[pinned]]
    elif plan.hardware == "nvidia":
        driver = _version_in(m.run(["nvidia-smi"]), r"CUDA Version:\s*(\d+\.\d+)")
        plan.reason = "NVIDIA GPU: the default PyPI wheels (built with CUDA)"
        if driver:
            plan.found.append(f"driver supports CUDA {driver}")
            if tuple(int(x) for x in driver.split(".")) < (12, 6):
                plan.notes.append(f"the driver supports CUDA {driver} only; if torch then finds no GPU, update the "
                                  "driver or set PORTACHAT_TORCH_INDEX=https://download.pytorch.org/whl/cu118")
        plan.installs = [[pinned]]
    elif plan.hardware == "rocm":
        installed = rocm_version(m)
        wheel = rocm_wheel_version(installed)
        plan.found.append(f"ROCm {installed or 'version unknown'}")
        plan.reason = f"AMD ROCm: the PyTorch ROCm {wheel} wheels (newest published ones not newer than the ROCm found)"
        plan.installs = [[pinned, "--index-url", ROCM_INDEX.format(wheel)]]
    elif plan.hardware == "xpu":
        plan.reason = "Intel GPU: the PyTorch XPU wheels"
        plan.installs = [[pinned, "--index-url", XPU_INDEX]]
    elif plan.hardware == "dcu":
        wheels_dir = m.env.get("PORTACHAT_DCU_WHEELS", "").strip()
        if not wheels_dir:
            plan.reason = "Hygon DCU: torch must be the DTK build from Hygon, which no public index serves"
            plan.stop = (
                "download the torch wheel built for your DTK version (Hygon developer community, "
                "https://developer.sourcefind.cn -> DAS / whl) into a directory, then run\n"
                "  PORTACHAT_DCU_WHEELS=/path/to/wheels bash scripts/setup.sh\n"
                "or name the wheel file directly: PORTACHAT_TORCH_SPEC=/path/to/torch-...whl bash scripts/setup.sh"
            )
        else:
            plan.reason = f"Hygon DCU: the DTK wheels in {wheels_dir} (no index is asked, so no CUDA build can come)"
            plan.installs = [["torch", "--no-index", "--find-links", wheels_dir]]
    elif plan.hardware == "ascend":
        plan_ascend(plan, cann_version(m))
    return plan


def plan_ascend(plan: Plan, cann: str | None, floor: str | None = None) -> None:
    """torch (CPU build) + torch_npu: the newest pair Ascend publishes for this CANN that meets the floor."""
    floor = floor or torch_floor()
    choice = ascend_choice(cann, floor)
    plan.found.append(f"CANN {cann or 'version unknown'}")
    if choice.torch is None:
        plan.reason = (f"Ascend NPU: Ascend's matching table pairs CANN {choice.cann_row} with torch "
                       f"{choice.newest_torch} at most, and portachat needs torch>={floor}")
        plan.stop = (f"upgrade CANN to {oldest_cann_for(floor)} or newer (the toolkit and the ops package for "
                     f"your chip, from {CANN_DOWNLOAD}), then\n"
                     "  source /usr/local/Ascend/ascend-toolkit/set_env.sh && bash scripts/setup.sh")
        return
    plan.reason = (f"Ascend NPU: torch {choice.torch} (CPU build) + torch_npu {choice.torch_npu}, the newest "
                   f"published pair for CANN {choice.cann_row} (Ascend's matching table)")
    if cann is None:
        plan.notes.append("CANN version not found: source CANN's set_env.sh first, or pick the pair yourself "
                          "with PORTACHAT_TORCH_SPEC='torch==X torch_npu==Y'")
    elif choice.newer_than_table:
        plan.notes.append(f"CANN {cann} is newer than the matching table setup knows (newest: CANN "
                          f"{choice.cann_row}): installing that row's newest pair; if `import torch_npu` fails, "
                          "install the pair Ascend publishes for your CANN: "
                          "PORTACHAT_TORCH_SPEC='torch==X torch_npu==Y' bash scripts/setup.sh")
    # torch from the CPU index: torch_npu must never sit next to a CUDA build of torch.
    plan.installs = [[f"torch=={choice.torch}", "--index-url", CPU_INDEX],
                     [f"torch_npu=={choice.torch_npu}", "pyyaml", "setuptools"]]


def companion_pins(torch_version: str) -> list[str]:
    """Constraints on packages built against torch that this torch needs (TORCH_COMPANIONS): none for a
    torch at or above every threshold."""
    return [pin for below, pin in TORCH_COMPANIONS if _release(torch_version) < _release(below)]


def plan_pins(plan: Plan) -> list[str]:
    """The exact torch / torch_npu versions the plan installs, held from the first install on, and the
    companions that torch needs."""
    pins = []
    for install in plan.installs:
        for arg in install:
            name = re.match(r"(torch|torch[_-]npu)==", arg)
            if name:
                pins.append(arg)
    torch = next((p.split("==", 1)[1] for p in pins if p.startswith("torch==")), None)
    return pins + (companion_pins(torch) if torch else [])


def installed_versions(python: str) -> dict[str, str]:
    """The installed versions of PINNED_PACKAGES in `python`'s environment (package metadata, no import)."""
    code = ("import importlib.metadata as m, json, sys\nout = {}\nfor name in sys.argv[1:]:\n"
            "    try:\n        out[name] = m.version(name)\n    except m.PackageNotFoundError:\n        pass\n"
            "print(json.dumps(out))")
    done = subprocess.run([python, "-c", code, *PINNED_PACKAGES], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"{python} could not list its packages: {done.stderr.strip()}")
    return json.loads(done.stdout)


def write_constraints(path: str, lines: list[str], why: str) -> None:
    """A pip constraints file: every later `pip install -c FILE` keeps these exact versions."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(f"# Written by scripts/setup.sh ({why}); passed as -c to every pip install it runs.\n"
                "# Delete .venv to choose the torch build again.\n")
        f.writelines(line + "\n" for line in lines)
    os.replace(tmp, path)


def pin_installed(path: str, python: str, floor: str | None = None) -> str | None:
    """Pin what the environment holds now; an error text when its torch is missing or below the floor."""
    floor = floor or torch_floor()
    have = installed_versions(python)
    if "torch" not in have:
        return f"no torch is installed in {python}'s environment; run bash scripts/setup.sh again"
    if _release(have["torch"]) < _release(floor):
        return (f"torch {have['torch']} is installed, but portachat needs torch>={floor} (pyproject.toml), and "
                "setup keeps the torch it installed. Install a torch build >= the floor for this hardware "
                "(PORTACHAT_TORCH_SPEC=... or, on Hygon, newer DTK wheels in PORTACHAT_DCU_WHEELS), "
                "delete .venv and run bash scripts/setup.sh again")
    pins = [f"{name}=={version}" for name, version in have.items()] + companion_pins(have["torch"])
    write_constraints(path, pins, "the installed torch build")
    return None


def fits_hardware(wheel: str, hardware: str) -> bool:
    """Whether a local torch wheel of the default version is the build for this hardware
    (torch-2.13.0+cpu-... for CPU; an untagged Linux wheel is the CUDA build)."""
    m = re.match(rf"torch-{re.escape(TORCH_VERSION)}(\+(\w+))?-", wheel)
    if not m:
        return False
    tag = m.group(2) or ""
    if hardware == "macos":
        return True
    if hardware == "cpu":
        return tag == "cpu"
    if hardware == "nvidia":
        return tag == "" or tag.startswith("cu")
    return hardware in ("rocm", "xpu") and tag.startswith(hardware)


def explain(plan: Plan) -> str:
    lines = [f"[setup] hardware: {plan.hardware} (found: {'; '.join(plan.found)})", f"[setup] torch: {plan.reason}"]
    pins = plan_pins(plan)
    if pins and not plan.stop:
        lines.append(f"[setup] pinned: {' '.join(pins)} in {CONSTRAINTS_FILE} (pip -c on every later install, so "
                     "no dependency can replace them; the exact installed versions are pinned after install)")
    lines += [f"[setup] note: {note}" for note in plan.notes]
    if plan.stop:
        lines.append(f"[setup] stopping: {plan.stop}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=None, help="the interpreter whose pip will install (reads its pip config)")
    parser.add_argument("--explain", action="store_true", help="print the reasons only")
    parser.add_argument("--root", default=os.environ.get("PORTACHAT_SETUP_ROOT", "/"),
                        help="filesystem root to inspect (tests simulate other machines with it)")
    parser.add_argument("--pins-file", default=None,
                        help="write the plan's torch / torch_npu pins to this pip constraints file")
    parser.add_argument("--pin-installed", metavar="FILE", default=None,
                        help="write the versions installed in --python's environment to FILE (after install)")
    args = parser.parse_args(argv)
    if args.pin_installed:
        error = pin_installed(args.pin_installed, args.python or sys.executable)
        if error:
            print(f"[setup] stopping: {error}", file=sys.stderr)
            return 2
        with open(args.pin_installed, encoding="utf-8") as f:
            held = [line.strip() for line in f if line.strip() and not line.startswith("#")]
        print(f"[setup] holding {' '.join(held)} ({args.pin_installed})", file=sys.stderr)
        torch = next((line.split("==", 1)[1] for line in held if line.startswith("torch==")), "")
        for pin in companion_pins(torch):  # said, not silent: the user sees why that package is older
            print(f"[setup] note: holding {pin} for torch {torch}: newer releases need a newer torch (they fail "
                  "to import, and transformers with them); a newer torch lifts the hold", file=sys.stderr)
        return 0
    plan = plan_install(Machine(args.root), args.python)
    print(explain(plan), file=sys.stderr)
    if plan.stop:
        return 2
    if args.pins_file:
        write_constraints(args.pins_file, plan_pins(plan), f"the build chosen for {plan.hardware}")
    if not args.explain:
        for install in plan.installs:
            print(shlex.join(install))
    return 0


if __name__ == "__main__":
    sys.exit(main())
