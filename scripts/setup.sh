#!/usr/bin/env bash
# Sets everything up on Debian 12: installs missing packages, configures and builds the release
# preset, and installs the Python package into .venv. Afterwards the command-line tool is
# build/release/maskattn and `.venv/bin/python -c "import maskattn"` works.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target maskattn_cli
scripts/python-env.sh
echo "setup: built build/release/maskattn; .venv/bin/python has the maskattn package"
