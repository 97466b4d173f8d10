#!/usr/bin/env bash
# Installs the Debian 12 packages maskattn needs to build and test, when they are missing.
# Nothing is downloaded when everything is already installed.
set -euo pipefail

packages=(
  g++ make cmake pkg-config git   # toolchain (OpenMP comes with g++)
  ccache                          # compiler cache: unchanged sources are not recompiled (scripts/ccache-env.sh)
  libgtest-dev libgmock-dev       # GoogleTest
  libbenchmark-dev                # Google Benchmark (bench/)
  libhwy-dev                      # Highway: SIMD with runtime dispatch (fused kernels)
  libdnnl-dev                     # oneDNN: the layers' dense products (src/kernels/gemm.cc)
  libcli11-dev                    # CLI11: the command line
  libfmt-dev                      # fmt: terminal output
  libstb-dev                      # stb: PNG heatmaps and their label font
  clang-format                    # style check in the test command
  clang-14 libclang-rt-14-dev     # libFuzzer and sanitizers for the fuzz targets (scripts/fuzz.sh)
  libomp-14-dev                   # OpenMP for the clang build of the fuzz targets
  libopenmpi-dev openmpi-bin      # Open MPI: the distributed ring (maskattn::distributed, mpirun tests)
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if ((${#missing[@]} > 0)); then
  echo "install-deps: installing ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
