#!/usr/bin/env bash
# The Hygon DCU (DTK / ROCm) check: one run under 10 minutes on one card, writing summary.json and summary.md (doctor
# and fast-path self-test verdicts, training tok/s and MFU with the fast paths vs the portable path at depth
# 12, ten `train base` steps with loader waits and memory vs `estimate memory`, engine decode at batch
# 1/8/32 vs transformers). Please share summary.md (README: "Checking an Ascend NPU or a Hygon DCU").
#   bash benchmarks/dcu_check.sh [--out DIR]    on the card
#   bash benchmarks/dcu_check.sh --dry-run      print the plan; needs no hardware (CI runs it)
exec bash "$(dirname "${BASH_SOURCE[0]}")/vendor_check.sh" dcu "$@"
