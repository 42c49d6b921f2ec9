#!/usr/bin/env bash
# The test command: set up (if needed), lint, then the fast suite and the slow end-to-end suite.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
.venv/bin/ruff check portachat tests benchmarks
# The floors: each package imports only from those below it (the contracts in pyproject.toml).
.venv/bin/lint-imports
.venv/bin/python -m pytest -q "$@"
# The slowest tests by name: the slow suite has a time budget (CI runs the whole command in 30 minutes).
.venv/bin/python -m pytest -q -m slow --durations=25 "$@"
