#!/usr/bin/env bash
# Fails when a C++ file is not formatted as .clang-format says (fix with: clang-format -i FILE).
set -euo pipefail
cd "$(dirname "$0")/.."

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.cc' '*.h')
else
  mapfile -t files < <(find include src tools tests bench -name '*.cc' -o -name '*.h' 2>/dev/null)
fi
clang-format --dry-run --Werror "${files[@]}"
echo "check-format: ${#files[@]} files formatted"
