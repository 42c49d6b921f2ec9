#!/usr/bin/env bash
# The main job: set up (if needed), check the environment, then pretrain.
#   bash scripts/run.sh                      doctor + a short quick-start pretraining run
#   bash scripts/run.sh --data DIR --depth 12 --run-name mine ...   your own `portachat train base` flags
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
if ! .venv/bin/portachat doctor; then
  echo "[run] portachat doctor found a problem; fix it (see above) and run again." >&2
  exit 1
fi
if [ "$#" -eq 0 ]; then
  # Quick start: short enough for a laptop CPU (a few minutes), on the built-in synthetic
  # curriculum unless you pass --data. A real run sets its own --depth / --num-iterations.
  set -- --run-name "quickstart-$(date +%Y%m%d-%H%M%S)" --num-iterations 200 --eval-every 100 --save-every 100
fi
exec .venv/bin/portachat train base "$@"
