#!/usr/bin/env bash
# Installs what this project needs on Debian 12, and nothing that is already there.
# Idempotent: `apt-get update` runs only when something is missing.
set -euo pipefail

packages=(
  cmake g++ make ccache
  libtorch-dev python3-torch python3-numpy
  catch2 libfmt-dev nlohmann-json3-dev zlib1g-dev
  # One source for the vector kernels, per instruction set (Google Highway).
  libhwy-dev
  # attention::distributed: the Gloo headers and library that LibTorch's c10d was built with.
  libgloo-dev
  # Without OpenBLAS Debian's libtorch falls back to the reference BLAS, ~24x slower.
  libopenblas0-openmp
  # The fused CPU kernels' tile products (generated per shape; BLAS where it is missing).
  libxsmm-dev
  # scripts/bench.sh compares against Python with tcmalloc preloaded; matplotlib draws its plots.
  libtcmalloc-minimal4 python3-matplotlib
  # API docs and the lint step of scripts/test.sh.
  doxygen clang-format shellcheck
  # scripts/fuzz.sh: clang with the libFuzzer runtime.
  clang libclang-rt-14-dev
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo_cmd=()
if ((EUID != 0)); then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
