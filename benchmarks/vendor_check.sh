#!/usr/bin/env bash
# The body of benchmarks/npu_check.sh and benchmarks/dcu_check.sh (run those): one short run on the card
# (at most 10 minutes), each part under its own `timeout`, every part's log plus summary.json and
# summary.md in --out. Parts: doctor --json --selftest (decisions, runtime environment, fast-path
# verdicts); training tok/s and MFU at depth 12 with the fast paths and with the portable path only
# (PORTACHAT_FAST_PATHS=0), each beside train_throughput.py's plain PyTorch peer; ten `train base` steps
# (loader waits, peak memory) against `estimate memory`; engine decode at batch 1/8/32 against
# transformers on the same card. A part that fails or runs out of time is recorded and the next one runs.
#   bash benchmarks/vendor_check.sh KIND [--dry-run] [--out DIR]    KIND: npu | dcu
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
kind="${1:-}"
case "$kind" in npu|dcu) shift ;; *) echo "[vendor_check] the first argument is the kind: npu or dcu" >&2; exit 2 ;; esac
tag="${kind}_check"
dry_run=0
out="$tag-$(date -u +%Y%m%d-%H%M%S)"
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --out) [ $# -ge 2 ] || { echo "[$tag] --out needs a directory" >&2; exit 2; }; out="$2"; shift ;;
    -h|--help) echo "usage: bash benchmarks/$tag.sh [--dry-run] [--out DIR]"; sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "[$tag] unknown option $1 (valid: --dry-run, --out DIR, --help)" >&2; exit 2 ;;
  esac
  shift
done
py="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
if [ "$dry_run" = 0 ]; then
  mkdir -p "$out" || exit 2
  out="$(cd "$out" && pwd)"
  : > "$out/status.tsv"
fi
echo "[$tag] plan$([ "$dry_run" = 1 ] && echo " (dry run: nothing runs)"), results in $out/"

plan_only="$dry_run"
source benchmarks/check_parts.sh  # part NAME SECONDS COMMAND...: its output in NAME.log (dry run: the plan only)

# Depth 12 at 2048 tokens, dtype and compile as the device layer chooses them (Ascend: eager, bf16 on A2/A3,
# fp16 on 910A; DCU: bf16 where the arch has it, eager unless Hygon's Triton is there). Budgets add up to
# 585 s: with the report, under 10 minutes whatever hangs.
depth=12 seq=2048 batch=8
tt=("$py" benchmarks/train_throughput.py --device "$kind" --depth "$depth" --seq-len "$seq" --batch-size "$batch"
    --steps 10 --warmup 2 --rounds 1 --json)
part doctor 60 "$py" -m portachat doctor --json --selftest
part train_fast 130 env PORTACHAT_FAST_PATHS=1 "${tt[@]}"
part train_portable 130 env PORTACHAT_FAST_PATHS=0 "${tt[@]}"
part train_base 100 "$py" -m portachat train base --device "$kind" --depth "$depth" --max-seq-len "$seq" \
  --device-batch-size "$batch" --total-batch-size "$((batch * seq))" --num-iterations 10 --eval-every 0 \
  --eval-tokens "$((batch * seq))" --save-every 0 --log-every 1 --runs-root "$out/runs" --run-name "$tag" --overwrite
part estimate 15 "$py" -m portachat estimate memory --depth "$depth" --device-batch-size "$batch" --max-seq-len "$seq" \
  --dtype bf16 --json
part decode 150 "$py" benchmarks/decode.py --device "$kind" --models ours --depth "$depth" --batch-sizes 1,8,32 \
  --prompt-len 64 --new-tokens 128 --rounds 2 --json

if [ "$dry_run" = 1 ]; then
  echo "[$tag] $planned s of budgets in all; run it on the card without --dry-run, then share $out/summary.md"
  exit 0
fi
"$py" benchmarks/vendor_check_report.py "$out" --kind "$kind"
