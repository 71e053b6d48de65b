#!/usr/bin/env bash
# The second LibTorch generation: builds and runs the whole C++ suite against Debian 13's
# LibTorch 2.6 (with its python3-torch for the Python-side tests) inside a Debian 13 root made
# with debootstrap and kept in a cache folder outside the checkout.
#
#   scripts/test_libtorch2.sh          (scripts/test.sh --libtorch2 runs this)
#   ATTENTION_DEBIAN13_ROOT=DIR        where the root lives (default /var/cache/attention-cpp/trixie)
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

# debootstrap, chroot and mount live in the sbin folders, which not every PATH has.
export PATH="$PATH:/usr/sbin:/sbin"
start=$SECONDS
root=${ATTENTION_DEBIAN13_ROOT:-/var/cache/attention-cpp/trixie}
packages=g++,cmake,make,libtorch-dev,python3-torch,python3-numpy,catch2,libfmt-dev,nlohmann-json3-dev,libopenblas0-openmp
sudo_cmd=()
if ((EUID != 0)); then sudo_cmd=(sudo); fi

if [[ ! -x $root/usr/bin/g++ ]]; then
  if ! command -v debootstrap >/dev/null; then
    "${sudo_cmd[@]}" apt-get update -qq
    "${sudo_cmd[@]}" apt-get install -y -qq debootstrap
  fi
  echo "test_libtorch2.sh: creating the Debian 13 root in $root (a few minutes, ~1.5 GB)"
  "${sudo_cmd[@]}" rm -rf "$root.partial"
  "${sudo_cmd[@]}" mkdir -p "$(dirname "$root")"
  "${sudo_cmd[@]}" debootstrap --variant=minbase --include="$packages" trixie "$root.partial" \
    http://deb.debian.org/debian >/dev/null
  "${sudo_cmd[@]}" mv "$root.partial" "$root"
fi

# One run at a time per root: a second would stack its mounts on the first's.
exec 9>"$root.lock"
flock -n 9 || { echo "test_libtorch2.sh: another run is using $root" >&2; exit 1; }

# /proc for LibTorch's CPU detection (without it, it falls back to "NO AVX"); the checkout at
# /src. Both are unmounted on every way out.
mounted=()
cleanup() {
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do "${sudo_cmd[@]}" umount "${mounted[i]}" || true; done
}
trap cleanup EXIT
"${sudo_cmd[@]}" mkdir -p "$root/src"
"${sudo_cmd[@]}" mount -t proc proc "$root/proc" && mounted+=("$root/proc")
"${sudo_cmd[@]}" mount --bind "$ROOT" "$root/src" && mounted+=("$root/src")

# The inner script is quoted on purpose: it expands inside the root.
# shellcheck disable=SC2016
"${sudo_cmd[@]}" chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  JOBS="$JOBS" /bin/bash -euo pipefail -c '
    python3 -c "import torch; print(\"test_libtorch2.sh: torch\", torch.__version__)"
    build=/var/tmp/attention-build
    cmake -S /src -B "$build" -DCMAKE_BUILD_TYPE=Release -DATTENTION_BUILD_TESTS=ON \
      -DATTENTION_BUILD_TOOLS=ON >/dev/null
    cmake --build "$build" -j "$JOBS"
    "$build/attention-demo" | tail -n 1
    cd "$build" && ctest --output-on-failure -j "$JOBS"'
echo "test_libtorch2.sh: LibTorch 2 leg took $((SECONDS - start)) s"
