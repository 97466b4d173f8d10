#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it: formatting, a warnings-as-errors release build with
# every test, then the same suite under AddressSanitizer + UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="$(nproc)"

scripts/install-deps.sh
scripts/check-format.sh

for preset in release asan; do
  echo "=== ${preset}: configure, build, test ==="
  cmake --preset "$preset" -DMASKATTN_WERROR=ON >/dev/null
  cmake --build --preset "$preset" -j "$jobs"
  ctest --preset "$preset" -j "$jobs"
done
echo "test: all suites passed"
