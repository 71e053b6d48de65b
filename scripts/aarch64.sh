#!/usr/bin/env bash
# 64-bit ARM: cross-compiles the library and its tests for aarch64 with Debian's cross compiler
# against Debian's arm64 LibTorch, and runs them under the emulator (qemu-aarch64-static; this
# machine kind has no binfmt_misc, so CMake's CMAKE_CROSSCOMPILING_EMULATOR calls it by name).
#
#   scripts/aarch64.sh [ARGS...]         the CI leg: the test program alone, and the tests of the
#                                        fused kernels, the paged kernel and the contract on every
#                                        vector route (the emulator's best, NEON, the portable loops);
#                                        CTest ARGS in place of that choice of tests
#   scripts/aarch64.sh --full [ARGS...]  everything, and CTest with ARGS (e.g. -R test_varlen)
#
# The emulated processor is qemu's `max` (NEON, SVE and SVE2 with 512-bit vectors, BF16, I8MM).
# The sysroot (Debian's arm64 packages of libtorch-dev and what the build needs, extracted;
# ~940 MB) is made once in a cache folder outside the checkout, as scripts/debian13.sh keeps its
# root, and made again when the list of packages below changes:
#   ATTENTION_AARCH64_SYSROOT=DIR   (default /var/cache/attention-cpp/aarch64/sysroot)
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"
sysroot=${ATTENTION_AARCH64_SYSROOT:-/var/cache/attention-cpp/aarch64/sysroot}
build=$ROOT/build-aarch64
sudo=()
if ((EUID != 0)); then sudo=(sudo); fi

if ! command -v aarch64-linux-gnu-g++ >/dev/null || ! command -v qemu-aarch64-static >/dev/null; then
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq g++-aarch64-linux-gnu \
    qemu-user-static >/dev/null
fi
# What the build needs, as arm64 packages (or architecture-independent ones).
wanted="libtorch-dev:arm64 libfmt-dev:arm64 zlib1g-dev:arm64 libhwy-dev:arm64 catch2:arm64 \
nlohmann-json3-dev libudev1:arm64"
if [[ $(cat "$sysroot/.packages" 2>/dev/null) != "$wanted" ]]; then
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    "${sudo[@]}" dpkg --add-architecture arm64
  fi
  "${sudo[@]}" apt-get update -qq
  debs=$(dirname "$sysroot")/debs
  "${sudo[@]}" rm -rf "$sysroot" "$debs"
  "${sudo[@]}" mkdir -p "$sysroot" "$debs"
  # Their closure, less the tools a sysroot does not run (Python, Perl, dpkg and the like).
  # shellcheck disable=SC2086  # one package a word
  names=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
    --no-replaces --no-enhances $wanted 2>/dev/null | grep -v '^ ' |
    sed 's/[<>]//g; s/:arm64$//' | sort -u |
    grep -v -E '^(python3|libpython|perl|libperl|dpkg|debconf|cdebconf|adduser|fonts-|fontconfig|sensible-utils|ucf|install-info|init-system|sysvinit|lsb-base|tzdata|netbase|dbus|systemd|util-linux|mount|login|passwd|libpam)')
  # shellcheck disable=SC2086,SC2046  # one name per word
  packages=$( (apt-cache show $(printf '%s:arm64 ' $names) 2>/dev/null
    apt-cache show $names 2>/dev/null) |
    awk '/^Package:/{p=$2} /^Architecture:/{if ($2 == "all") print p; else if ($2 == "arm64") print p ":arm64"}' |
    sort -u)
  # Warnings of an unsandboxed download (as root) are not errors.
  # shellcheck disable=SC2086
  (
    cd "$debs"
    "${sudo[@]}" apt-get download -qq $packages 2>&1 | { grep -v '^W:' || true; }
  )
  for deb in "$debs"/*.deb; do "${sudo[@]}" dpkg-deb -x "$deb" "$sysroot"; done
  # The alternatives a package install would set: BLAS and LAPACK from OpenBLAS.
  lib=$sysroot/usr/lib/aarch64-linux-gnu
  "${sudo[@]}" ln -sf openblas-pthread/libblas.so.3 "$lib/libblas.so.3"
  "${sudo[@]}" ln -sf openblas-pthread/liblapack.so.3 "$lib/liblapack.so.3"
  echo "$wanted" | "${sudo[@]}" tee "$sysroot/.packages" >/dev/null
fi

full=false
if [[ ${1:-} == --full ]]; then
  full=true
  shift
fi
start=$SECONDS
ATTENTION_AARCH64_SYSROOT=$sysroot cmake -S "$ROOT" -B "$build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_TOOLCHAIN_FILE="$ROOT/cmake/aarch64-linux-gnu.cmake" -DATTENTION_BUILD_TESTS=ON \
  -DATTENTION_BUILD_TOOLS=OFF -DATTENTION_DISTRIBUTED=OFF -DATTENTION_BUILD_OPERATORS=OFF >/dev/null
if $full; then
  cmake --build "$build" -j "$JOBS"
else
  cmake --build "$build" -j "$JOBS" --target attention-tests
fi
echo "aarch64.sh: the cross build took $((SECONDS - start)) s"
export QEMU_LD_PREFIX=$sysroot
export LD_LIBRARY_PATH=$sysroot/usr/lib/aarch64-linux-gnu/openblas-pthread:$sysroot/usr/lib/aarch64-linux-gnu
if ! $full && (($# == 0)); then
  # The kernels' own tests (the bfloat16 products' among them) and the contract's (every option
  # at its extremes, NaN and infinite values) on the emulator's best route, then on NEON's and the
  # portable loops.
  set -- -R '^(test_contract|test_chunked|test_cpu_softmax|test_cpu_decode_products|test_bf16_route|test_paged_attention|test_shared_prefix_attention|chunked\.(neon|portable)_softmax)$'
fi
(cd "$build" && ctest --output-on-failure -j "$JOBS" "$@")
echo "aarch64.sh: took $((SECONDS - start)) s"
