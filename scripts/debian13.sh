# The Debian 13 root with LibTorch 2.6, made with debootstrap and kept in a cache folder outside
# the checkout; shared by scripts/test_libtorch2.sh and scripts/bench.sh --libtorch2.
#
#   ATTENTION_DEBIAN13_ROOT=DIR   where the root lives (default /var/cache/attention-cpp/trixie)
# shellcheck shell=bash

# debootstrap, chroot and mount live in the sbin folders, which not every PATH has.
export PATH="$PATH:/usr/sbin:/sbin"
DEBIAN13_ROOT=${ATTENTION_DEBIAN13_ROOT:-/var/cache/attention-cpp/trixie}
DEBIAN13_BUILD=/var/tmp/attention-build  # inside the root
# ccache: the checkout is /src in every run, so a run compiles only what changed since the last
# (its cache lives inside the root, in its home folder).
debian13_packages=g++,cmake,make,ccache,libtorch-dev,python3-torch,python3-numpy,catch2,libfmt-dev,nlohmann-json3-dev,zlib1g-dev,libhwy-dev,libgloo-dev,libopenblas0-openmp,libxsmm-dev
debian13_sudo=()
if ((EUID != 0)); then debian13_sudo=(sudo); fi
debian13_mounts=()

debian13_unmount() {
  for ((i = ${#debian13_mounts[@]} - 1; i >= 0; i--)); do
    "${debian13_sudo[@]}" umount "${debian13_mounts[i]}" || true
  done
  debian13_mounts=()
}

# Runs a bash script inside the root, as root, with a clean environment; the checkout is /src.
debian13_run() {
  "${debian13_sudo[@]}" chroot "$DEBIAN13_ROOT" /usr/bin/env -i \
    PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root JOBS="$JOBS" /bin/bash -euo pipefail -c "$1"
}

# Makes the root if it is missing, takes its lock (a second run would stack its mounts on the
# first's), mounts /proc (without it LibTorch's CPU detection falls back to "NO AVX"), the
# machine's /etc/hosts and the checkout at /src, unmounted again on every way out, and installs
# any of the build's packages (which grow with the project) or the named extra ones the root lacks.
# shellcheck disable=SC2120  # the packages are optional
debian13_enter() {
  local dir=$DEBIAN13_ROOT
  # shellcheck disable=SC2086  # one package a word
  set -- ${debian13_packages//,/ } "$@"
  if [[ ! -x $dir/usr/bin/g++ ]]; then
    if ! command -v debootstrap >/dev/null; then
      "${debian13_sudo[@]}" apt-get update -qq
      "${debian13_sudo[@]}" apt-get install -y -qq debootstrap
    fi
    echo "debian13.sh: creating the Debian 13 root in $dir (a few minutes, ~1.5 GB)" >&2
    "${debian13_sudo[@]}" rm -rf "$dir.partial"
    "${debian13_sudo[@]}" mkdir -p "$(dirname "$dir")"
    "${debian13_sudo[@]}" debootstrap --variant=minbase --include="$debian13_packages" trixie \
      "$dir.partial" http://deb.debian.org/debian >/dev/null
    "${debian13_sudo[@]}" mv "$dir.partial" "$dir"
  fi
  exec 9>"$dir.lock"
  flock -n 9 || { echo "debian13.sh: another run is using $dir" >&2; exit 1; }
  trap debian13_unmount EXIT
  "${debian13_sudo[@]}" mkdir -p "$dir/src"
  "${debian13_sudo[@]}" mount -t proc proc "$dir/proc" && debian13_mounts+=("$dir/proc")
  "${debian13_sudo[@]}" mount --bind "$ROOT" "$dir/src" && debian13_mounts+=("$dir/src")
  # The machine's own names (its hostname among them), which c10d's stores and Gloo resolve.
  "${debian13_sudo[@]}" mount --bind /etc/hosts "$dir/etc/hosts" && debian13_mounts+=("$dir/etc/hosts")
  # The names are expanded inside the root: they are passed as arguments, not code.
  # shellcheck disable=SC2016
  "${debian13_sudo[@]}" chroot "$dir" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    /bin/bash -euo pipefail -c '
      missing=()
      for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
      if ((${#missing[@]})); then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
      fi' debian13 "$@"
}

# Configures and builds the checkout in the root's build folder.
debian13_build() {
  debian13_run "cmake -S /src -B $DEBIAN13_BUILD -DCMAKE_BUILD_TYPE=Release $* >/dev/null
    cmake --build $DEBIAN13_BUILD -j \"\$JOBS\""
}
