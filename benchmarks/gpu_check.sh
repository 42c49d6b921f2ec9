#!/usr/bin/env bash
# The GPU check: one short run (at most 7 minutes on one H100/H200) that measures what CPU tests cannot
# see, each part under its own `timeout`, writing every part's log, summary.json and summary.md to --out.
#   bash benchmarks/gpu_check.sh [--out DIR]            on the accelerator (depth 12, 2048 tokens, bf16)
#   bash benchmarks/gpu_check.sh --dry-run [--out DIR]  the same plan at toy size on the CPU (CI runs it)
# Parts: doctor --json; train_throughput.py (ours vs the plain PyTorch reference, compiled); the profiler's
# step split and top kernels (portachat profile); ten steps of `train base` and its peak memory against
# `estimate memory`; the engine's decode graphs vs eager and two engines in two threads
# (benchmarks/engine_graphs.py); decode.py at batch 1/8/32/64 against transformers.
# A part that fails or runs out of time is recorded as such and the next one runs.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
dry_run=0
out="gpu-check-$(date -u +%Y%m%d-%H%M%S)"
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --out) [ $# -ge 2 ] || { echo "[gpu_check] --out needs a directory" >&2; exit 2; }; out="$2"; shift ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "[gpu_check] unknown option $1 (valid: --dry-run, --out DIR, --help)" >&2; exit 2 ;;
  esac
  shift
done
py="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
mkdir -p "$out" || exit 2
out="$(cd "$out" && pwd)"
: > "$out/status.tsv"

if [ "$dry_run" = 1 ]; then  # toy sizes on the CPU: the plan and its outputs, not the numbers
  mode=dry-run device=(--device cpu) depth=2 seq=64 batch=2 dtype=fp32 compile=0
  tt_steps=(--steps 2 --warmup 1 --rounds 1) train_steps=3 vocab=(--vocab-size 512 --tokenizer-max-chars 200000)
  engine=(--depth 2 --batch 2 --prompt-len 8 --new-tokens 8) decode=(--batch-sizes 1,2 --prompt-len 8 --new-tokens 4 --rounds 1)
else
  mode=gpu device=() depth=12 seq=2048 batch=16 dtype=bf16 compile=1
  tt_steps=(--steps 20 --warmup 5 --rounds 2) train_steps=10 vocab=()
  engine=(--depth 12 --batch 8 --prompt-len 64 --new-tokens 128) decode=(--batch-sizes 1,8,32,64 --prompt-len 64 --new-tokens 128 --rounds 3)
fi

tag=gpu_check
source benchmarks/check_parts.sh  # part NAME SECONDS COMMAND...: its output in NAME.log, one status line

# Budgets add up to 420 s: 7 minutes at most, whatever hangs. Compilation is spent where it is measured
# (train_throughput); the profile and the ten training steps run eager to fit (their split and memory
# are the eager step's, which the memory estimate models).
part doctor 25 "$py" -m portachat doctor --json
part train_throughput 130 "$py" benchmarks/train_throughput.py "${device[@]}" --depth "$depth" --seq-len "$seq" \
  --batch-size "$batch" --dtype "$dtype" --compile "$compile" "${tt_steps[@]}" --json
part profile 35 "$py" -m portachat profile "${device[@]}" --depth "$depth" --device-batch-size "$batch" \
  --max-seq-len "$seq" --dtype "$dtype" --compile 0 --steps 2 --warmup 1 --out "$out/profile"
part train_base 75 "$py" -m portachat train base "${device[@]}" --depth "$depth" --max-seq-len "$seq" \
  --device-batch-size "$batch" --total-batch-size "$((batch * seq))" --num-iterations "$train_steps" --dtype "$dtype" \
  --compile 0 --eval-every 0 --eval-tokens "$((batch * seq))" --save-every 0 --log-every 1 "${vocab[@]}" \
  --runs-root "$out/runs" --run-name gpu_check --overwrite
# The estimate for the vocabulary the run trained its tokenizer to (read from its checkpoint).
vocab_size=$("$py" -c 'import json,glob,sys; c=sorted(glob.glob(sys.argv[1]+"/runs/gpu_check/base/step_*/config.json"))
print(json.load(open(c[-1]))["vocab_size"] if c else 32768)' "$out")
part estimate 15 "$py" -m portachat estimate memory --depth "$depth" --device-batch-size "$batch" --max-seq-len "$seq" \
  --dtype "$dtype" --vocab-size "$vocab_size" --json
part engine_graphs 45 "$py" benchmarks/engine_graphs.py "${device[@]}" "${engine[@]}" --json
part decode 95 "$py" benchmarks/decode.py "${device[@]}" --models ours --depth "$depth" "${decode[@]}" --json

"$py" benchmarks/gpu_check_report.py "$out" --mode "$mode"
