#!/usr/bin/env bash
# Builds the libFuzzer targets (preset "fuzz": clang 14, ASan + UBSan) and runs each for SECONDS
# (default 60) from a scratch copy of its committed seed corpus in fuzz/corpus/<name>. A crash,
# sanitizer report, leak, timeout or kernel disagreement fails the script; the reproducer is left
# in build/fuzz/artifacts/. Usage: scripts/fuzz.sh [SECONDS] [NAME...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
names=("$@")
[[ ${#names[@]} -gt 0 ]] || names=(npy mask_spec attention)

source scripts/ccache-env.sh
cmake --preset fuzz "${ccache_launcher[@]}" >/dev/null
cmake --build --preset fuzz -j "$(nproc)"

artifacts="build/fuzz/artifacts"
mkdir -p "$artifacts"
for name in "${names[@]}"; do
  corpus="$(mktemp -d)"
  cp -r "fuzz/corpus/${name}/." "$corpus/"
  echo "=== fuzz ${name}: ${seconds} s ==="
  # -timeout: one input taking over 10 s is a hang; -rss_limit_mb: unbounded allocation is a bug.
  log="${artifacts}/${name}.log"
  set +e
  ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    "build/fuzz/fuzz/${name}_fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="${artifacts}/${name}-" "$corpus" >"$log" 2>&1
  status=$?
  set -e
  grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::peak_rss_mb)" "$log" || true
  rm -rf "$corpus"
  if [[ "$status" != 0 ]]; then
    grep -E "runtime error|ERROR|SUMMARY|fused|reference|rejected" "$log" | head -20 >&2 || true
    echo "fuzz: ${name} failed (exit ${status}); log ${log}, reproducer in ${artifacts}/" >&2
    exit 1
  fi
done
echo "fuzz: all targets ran clean"
