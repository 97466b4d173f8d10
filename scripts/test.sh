#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it: formatting, a warnings-as-errors release build with
# every test, the Python package's tests (pytest in .venv, against PyTorch 2.x), then the C++ suite
# under AddressSanitizer + UndefinedBehaviorSanitizer (whose kernel sweeps take every other shape of
# the release pass's edge-case sweep: tests/test_util.cc, for_each_edge_case).
#
#   scripts/test.sh           the full suite (what CI runs)
#   scripts/test.sh --quick   the edit–test loop: release build, every test but the long kernel
#                             sweeps (label `sweep`, tests/CMakeLists.txt); no formatting, no
#                             sanitizers
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="$(nproc)"

case "${1:-}" in
  "") ;;
  --quick)
    cmake --preset release -DMASKATTN_WERROR=ON >/dev/null
    cmake --build --preset release -j "$jobs"
    ctest --preset release -j "$jobs" --label-exclude sweep
    echo "test: quick subset passed (the full suite is scripts/test.sh with no argument)"
    exit 0
    ;;
  *)
    echo "usage: scripts/test.sh [--quick]" >&2
    exit 2
    ;;
esac

scripts/install-deps.sh
scripts/check-format.sh
source scripts/ccache-env.sh

for preset in release asan; do
  echo "=== ${preset}: configure, build, test ==="
  cmake --preset "$preset" -DMASKATTN_WERROR=ON "${ccache_launcher[@]}" >/dev/null
  cmake --build --preset "$preset" -j "$jobs"
  ctest --preset "$preset" -j "$jobs"
  if [[ "$preset" == release ]]; then
    echo "=== python: install the package and the test requirements into .venv, run pytest ==="
    CMAKE_ARGS="-DMASKATTN_WERROR=ON ${ccache_launcher[*]}" scripts/python-env.sh --test
    .venv/bin/python -m pytest python/tests -q
  fi
done
echo "test: all suites passed"
