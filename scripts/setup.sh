#!/usr/bin/env bash
# Sets everything up on Debian 12: installs missing packages, configures and builds the release
# preset. Afterwards the command-line tool is build/release/maskattn.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target maskattn_cli
echo "setup: built build/release/maskattn"
