#!/usr/bin/env bash
# Creates .venv (if missing) and installs portachat into it. Idempotent and quiet when up to date.
# torch is installed FIRST and pinned, so nothing later pulls a multi-GB CUDA build onto a CPU-only
# machine through an open version range. Override with PORTACHAT_TORCH_SPEC (e.g. for a ROCm or
# Ascend-matched torch); Ascend users add the npu extra: PORTACHAT_EXTRAS=dev,npu.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${PYTHON:-python3}"
torch_spec="${PORTACHAT_TORCH_SPEC:-torch==2.13.0}"
extras="${PORTACHAT_EXTRAS:-dev,serve}"

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($python --version)"
  "$python" -m venv .venv
fi
pip=(.venv/bin/python -m pip --disable-pip-version-check)
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  echo "[setup] installing $torch_spec"
  "${pip[@]}" install -q "$torch_spec"
fi
stamp=".venv/.portachat-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "[setup] installing portachat[$extras] (editable)"
  "${pip[@]}" install -q -e ".[$extras]"
  touch "$stamp"
fi
