# Shared by the scripts: where things are, and the one configure-and-build step.
# shellcheck shell=bash

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
# Debian's python3 has torch; a python3 earlier on PATH may not.
PYTHON=${PYTHON:-/usr/bin/python3}
JOBS=${JOBS:-$(nproc)}

configure_and_build() {
  cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release "$@"
  cmake --build "$BUILD_DIR" -j "$JOBS"
}

# The one configuration of BUILD_DIR that scripts/demo.sh and scripts/test.sh share, so that
# running both compiles the library once: shared, with the tests, the tools and
# attention::distributed. Further arguments go to the configure (scripts/compile_times.sh adds
# its timing launcher).
# shellcheck disable=SC2120  # callers without arguments take the suite as it is
configure_suite() {
  cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DATTENTION_BUILD_TESTS=ON -DATTENTION_BUILD_TOOLS=ON -DATTENTION_DISTRIBUTED=ON "$@"
}

# The one build with AddressSanitizer and UndefinedBehaviorSanitizer: clang, with libFuzzer's
# instrumentation, so that `test.sh --sanitize` (the whole suite) and fuzz.sh (the fuzz targets)
# share its objects instead of compiling the library twice. -O1 and line tables (file and line
# in every report's stack) compile in about 20% less time than RelWithDebInfo's -O2 -g. The
# tools are left out: the benchmark's and the demo's runs reach library code that the tests run
# sanitized, and the optimized build runs both. The line tables name the files relative to the
# checkout: the compiler cache keys files with debug information by their folder too, mapped so
# (CMakeLists.txt says why it matters). No precompiled header: CMake hands Clang its paths behind
# -Xclang, which the cache keeps as they are, so a clone at another folder (CI's) missed every file
# compiled with it (26 of 54, ~250 s); without it such a clone is served all of them, and a build
# with nothing cached takes ~80 s longer (420 against 502 s, measured back to back).
SANITIZE_BUILD_DIR=$ROOT/build-sanitize
configure_sanitized() {
  local map=""
  [[ $ROOT =~ [[:space:]] ]] || map="-fdebug-prefix-map=$ROOT=."
  CC=clang CXX=clang++ cmake -S "$ROOT" -B "$SANITIZE_BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG $map" \
    -DATTENTION_FUZZ=ON -DATTENTION_BUILD_TESTS=ON -DATTENTION_BUILD_TOOLS=OFF \
    -DATTENTION_DISTRIBUTED=ON -DATTENTION_PRECOMPILE_HEADERS=OFF >/dev/null
}

# Installs BUILD_DIR into WORK/prefix, once.
install_package() {
  local work=$1
  if [[ ! -d $work/prefix ]]; then
    cmake --install "$BUILD_DIR" --prefix "$work/prefix" >/dev/null
  fi
}

# Installs BUILD_DIR into WORK/prefix (once) and builds examples/NAME against the installed
# package into WORK/NAME, as a downstream project would; further arguments go to its configure.
# Through ccache where it is installed, with the suite's settings (CMakeLists.txt): where WORK
# lies below the checkout, a later run is served what an earlier one compiled, as long as the
# installed headers and the example are the same.
build_example() {
  local work=$1 name=$2 cache=()
  if command -v ccache >/dev/null; then
    cache=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  fi
  install_package "$work"
  cmake -S "$ROOT/examples/$name" -B "$work/$name" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$work/prefix" "${cache[@]}" "${@:3}" >/dev/null
  CCACHE_BASEDIR=$ROOT CCACHE_SLOPPINESS=include_file_mtime,include_file_ctime \
    cmake --build "$work/$name" -j "$JOBS" >/dev/null
}
