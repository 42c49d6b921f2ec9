# Sourced by benchmarks/gpu_check.sh and vendor_check.sh: `part NAME SECONDS COMMAND...` runs one part under its
# own `timeout`, its output in $out/NAME.log and one line in $out/status.tsv (ok / failed / timeout, rc, seconds,
# budget). The caller sets tag (the log prefix), out, and plan_only=1 to print the plan instead of running it;
# `planned` sums the budgets.
planned=0
part() {
  local name="$1" budget="$2"; shift 2
  planned=$((planned + budget))
  echo "[$tag] $name (at most ${budget}s): $*"
  [ "${plan_only:-0}" = 1 ] && return 0
  local start=$SECONDS
  timeout --kill-after=10 "$budget" "$@" > "$out/$name.log" 2>&1
  local rc=$? status=ok
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then status=timeout; elif [ "$rc" != 0 ]; then status=failed; fi
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" "$((SECONDS - start))" "$budget" >> "$out/status.tsv"
  echo "[$tag] $name: $status (rc $rc, $((SECONDS - start))s)"
}
