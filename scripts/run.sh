#!/usr/bin/env bash
# The main job: set up (if needed), check the environment, then train your own ChatGPT end to end.
#   bash scripts/run.sh                         doctor + `portachat speedrun` (preset chosen by hardware)
#   bash scripts/run.sh --preset d12 --nproc 8  your own `portachat speedrun` flags
#   bash scripts/run.sh --quickstart            doctor + a short pretraining-only run (200 steps)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
if ! .venv/bin/portachat doctor; then
  echo "[run] portachat doctor found a problem; fix it (see above) and run again." >&2
  exit 1
fi
if [ "${1:-}" = "--quickstart" ]; then
  shift
  # Pretraining only, short enough for a laptop CPU, on the built-in synthetic curriculum unless
  # you pass --data. Extra flags go to `portachat train base`.
  exec .venv/bin/portachat train base --run-name "quickstart-$(date +%Y%m%d-%H%M%S)" \
    --num-iterations 200 --eval-every 100 --save-every 100 "$@"
fi
exec .venv/bin/portachat speedrun "$@"
