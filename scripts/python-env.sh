#!/usr/bin/env bash
# Creates .venv (if missing) and installs the maskattn Python package into it, built from this
# checkout by scikit-build-core (build tree: build/python/, reused by the next install).
#
#   scripts/python-env.sh          the package and NumPy (what `import maskattn` needs)
#   scripts/python-env.sh --test   also what the Python tests need: pytest, PyTorch 2.x,
#                                  transformers, ml_dtypes (PyPI's Linux torch wheel pulls CUDA
#                                  libraries, several GB the first time; pip's cache keeps reruns
#                                  quick)
set -euo pipefail
cd "$(dirname "$0")/.."

extras=""
case "${1:-}" in
  "") ;;
  --test) extras="[test]" ;;
  *)
    echo "usage: scripts/python-env.sh [--test]" >&2
    exit 2
    ;;
esac

# `python3` on PATH (Debian's needs the python3-venv package for this; pyenv's has it).
python="${PYTHON:-python3}"
[[ -x .venv/bin/python ]] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)
# The build requirements live in the venv so that reinstalls reuse build/python incrementally.
"${pip[@]}" install "scikit-build-core>=0.10" "nanobind>=2.4" numpy
cmake_args="${CMAKE_ARGS:-}"
if command -v ccache >/dev/null 2>&1; then
  cmake_args="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache ${cmake_args}"
fi
CMAKE_ARGS="$cmake_args" "${pip[@]}" install --no-build-isolation ".${extras}"
echo "python-env: .venv has maskattn $(.venv/bin/python -c 'import maskattn; print(maskattn.__version__)')"
