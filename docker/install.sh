#!/bin/sh
# The user step of every portachat image: scripts/setup.sh, the project's own install, so an image gets
# the torch build setup.sh chooses (or the one the build arguments name) and the same constraints file.
# A base whose Python already has torch (ROCm's and Hygon's PyTorch images) keeps that torch: the venv
# sees the base's package directories (a .pth file; --system-site-packages would miss a base that is itself
# a venv or conda, as rocm/pytorch's /opt/venv is) and setup.sh pins the torch it finds. Then the torch
# installed is checked against the versions the labels state (PORTACHAT_EXPECT_TORCH, ..._TORCH_NPU).
set -eu
cd /opt/portachat
if [ ! -x .venv/bin/python ] && python3 -c 'import torch' 2>/dev/null; then
  echo "[image] the base's Python has torch $(python3 -c 'import torch; print(torch.__version__)'): keeping it"
  python3 -m venv .venv
  purelib=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  python3 -c 'import site; print("\n".join(site.getsitepackages()))' > "$purelib/portachat-base-packages.pth"
fi
bash scripts/setup.sh
.venv/bin/python - <<'PY'
import importlib.metadata as m
import os
import sys

for name, env in (("torch", "PORTACHAT_EXPECT_TORCH"), ("torch_npu", "PORTACHAT_EXPECT_TORCH_NPU")):
    want = os.environ.get(env, "").strip()
    if not want:
        continue
    try:
        have = m.version(name)
    except m.PackageNotFoundError:
        have = "none"
    if have.split("+")[0] != want:
        sys.exit(f"[image] {name} {have} is installed, but the image's labels say {want}: pass the matching "
                 f"--base or build arguments to scripts/build_image.sh")
    print(f"[image] {name} {have} (as labelled)")
PY
# pip's cache stays out of the image (unless the build mounted one there to reuse: then it is kept)
grep -qs " $HOME/.cache/pip " /proc/self/mountinfo || rm -rf "$HOME/.cache/pip"
