"""What scripts/build_image.sh builds for a target: the Containerfile, the base, the versions its labels
state and the build arguments. Stdlib only; the torch/CANN/ROCm pairs come from scripts/choose_torch.py
(the table setup.sh installs from), so an image and a plain install agree.

    python3 docker/plan.py TARGET [BASE] [--cann VERSION]   # prints bash assignments for build_image.sh
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import choose_torch  # noqa: E402  (scripts/ is not a package)

TARGETS = ("cpu", "cuda", "rocm", "dcu", "ascend")
# The vendors' published bases. CPU: Debian (the slow test builds FROM a debootstrapped Debian of the same
# release). NVIDIA: the CUDA runtime (torch's CUDA wheels bring their own CUDA libraries; the host's driver
# comes in with --gpus). ROCm and Hygon: their PyTorch images, whose torch is kept. Ascend: the CANN image
# of the newest CANN row of Ascend's matching table with a release image.
DEFAULT_BASES = {
    "cpu": "docker.io/library/debian:bookworm-slim",
    "cuda": "docker.io/nvidia/cuda:12.8.1-runtime-ubuntu24.04",
    "rocm": "docker.io/rocm/pytorch:rocm7.1_ubuntu24.04_py3.12_pytorch_release_2.9.1",
    "dcu": "image.sourcefind.cn:5000/dcu/admin/base/pytorch:2.9.0-ubuntu22.04-dtk25.04.2-py3.10",
    "ascend": "quay.io/ascend/cann:9.1.0-910b-ubuntu22.04-py3.11",
}
CONTAINERFILES = {"dcu": "rocm"}  # Hygon DCU builds from the ROCm file with a DTK base


def _tag(base: str) -> str:
    """The tag of an image reference (after the last ':' that follows the last '/')."""
    name = base.rsplit("/", 1)[-1]
    return name.split(":", 1)[1] if ":" in name else ""


def _found(pattern: str, text: str) -> str:
    m = re.search(pattern, text, re.IGNORECASE)
    return m.group(1) if m else ""


def plan(target: str, base: str, cann: str = "") -> dict[str, str | list[str]]:
    """FILE (the Containerfile), BASE, PAIRS (one line for people) and ARGS (the build arguments, KEY=value)."""
    tag = _tag(base)
    args: dict[str, str] = {"BASE": base}
    if target == "cpu":
        args |= {"TORCH_VERSION": choose_torch.TORCH_VERSION, "PORTACHAT_TORCH_INDEX": choose_torch.CPU_INDEX}
        pairs = f"torch {choose_torch.TORCH_VERSION} (CPU wheels)"
    elif target == "cuda":
        cuda = _found(r"^(\d+\.\d+)", tag)
        # The default PyPI torch on Linux is the CUDA build; nothing on a build machine shows a GPU, so say it.
        args |= {"CUDA_VERSION": cuda, "TORCH_VERSION": choose_torch.TORCH_VERSION,
                 "PORTACHAT_TORCH_SPEC": f"torch=={choose_torch.TORCH_VERSION}"}
        pairs = f"CUDA runtime {cuda or 'of the base'} + torch {choose_torch.TORCH_VERSION} (PyPI's CUDA build)"
    elif target in ("rocm", "dcu"):
        rocm = _found(r"rocm(\d+\.\d+)", tag) if target == "rocm" else ""
        dtk = _found(r"dtk-?(\d+\.\d+(?:\.\d+)?)", tag) if target == "dcu" else ""
        torch = _found(r"pytorch_release_(\d+\.\d+\.\d+)", tag) or _found(r"^(\d+\.\d+\.\d+)", tag)
        args |= {"ROCM_VERSION": rocm, "DTK_VERSION": dtk, "TORCH_VERSION": torch}
        if target == "rocm":
            wheel = choose_torch.rocm_wheel_version(rocm or None)
            # only used when the base has no torch of its own
            args["PORTACHAT_TORCH_INDEX"] = choose_torch.ROCM_INDEX.format(wheel)
        platform = f"ROCm {rocm or '(version not in the tag)'}" if target == "rocm" else f"DTK {dtk or '(version not in the tag)'}"
        pairs = f"{platform} + torch {torch or '(the one the base ships)'} (kept from the base's Python)"
    elif target == "ascend":
        cann = cann or _found(r"^(\d+\.\d+\.(?:\d+|rc\d+|x))", tag).upper()
        if not cann:
            raise SystemExit(f"[image] the CANN version is not in the tag of {base}: pass --cann VERSION "
                             "(e.g. --cann 9.1.0)")
        choice = choose_torch.ascend_choice(cann, choose_torch.torch_floor())
        if choice.torch is None:
            raise SystemExit(f"[image] Ascend's matching table pairs CANN {choice.cann_row} with torch "
                             f"{choice.newest_torch} at most, below portachat's floor torch>="
                             f"{choose_torch.torch_floor()}: use a base of CANN "
                             f"{choose_torch.oldest_cann_for(choose_torch.torch_floor())} or newer")
        args |= {"CANN_VERSION": cann, "TORCH_VERSION": choice.torch, "TORCH_NPU_VERSION": choice.torch_npu}
        pairs = (f"CANN {cann} (table row {choice.cann_row}) -> torch {choice.torch} + torch_npu "
                 f"{choice.torch_npu} (Ascend's matching table, scripts/choose_torch.py)")
    else:
        raise SystemExit(f"[image] unknown target '{target}' (valid: {', '.join(TARGETS)})")
    return {"FILE": f"docker/{CONTAINERFILES.get(target, target)}.Containerfile", "BASE": base, "PAIRS": pairs,
            "ARGS": [f"{k}={v}" for k, v in args.items()]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target")
    parser.add_argument("base", nargs="?", default="")
    parser.add_argument("--cann", default="", help="the CANN version of an Ascend base whose tag does not say it")
    args = parser.parse_args()
    if args.target not in TARGETS:
        print(f"[image] unknown target '{args.target}' (valid: {', '.join(TARGETS)})", file=sys.stderr)
        return 2
    base = args.base or DEFAULT_BASES[args.target]
    for key, value in {"DEFAULT_BASE": DEFAULT_BASES[args.target], **plan(args.target, base, args.cann)}.items():
        # a bash array for the build arguments, a plain assignment for the rest
        print(f"{key}=({shlex.join(value)})" if isinstance(value, list) else f"{key}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
