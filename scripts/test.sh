#!/usr/bin/env bash
# Installs what is missing, checks formatting and scripts, builds, builds the API docs (any
# doxygen warning fails), runs every test, then builds and runs the example against the
# installed package. Exits non-zero on any failure.
#
#   scripts/test.sh              the above
#   scripts/test.sh --sanitize   builds the whole suite with AddressSanitizer and
#                                UndefinedBehaviorSanitizer (clang) in build-sanitize/, which
#                                scripts/fuzz.sh shares, and runs it
#   scripts/test.sh --libtorch2  builds and runs the suite against LibTorch 2.6 in a Debian 13
#                                root (scripts/test_libtorch2.sh)
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

"$ROOT/scripts/setup.sh"

if [[ ${1:-} == --libtorch2 ]]; then
  exec "$ROOT/scripts/test_libtorch2.sh"
fi
if [[ ${1:-} == --sanitize ]]; then
  start=$SECONDS
  configure_sanitized
  cmake --build "$SANITIZE_BUILD_DIR" -j "$JOBS"
  echo "test.sh --sanitize: build took $((SECONDS - start)) s"
  # LibTorch is not instrumented: leaks it keeps until exit and container annotations it lacks
  # are not findings about this code. An allocation beyond memory must fail as it does without
  # the sanitizer (LibTorch's allocator then raises c10::Error, which tests/test_extremes.cpp
  # expects), not abort the process.
  export ASAN_OPTIONS=detect_leaks=0:detect_container_overflow=0:allocator_may_return_null=1
  export UBSAN_OPTIONS=print_stacktrace=1
  (cd "$SANITIZE_BUILD_DIR" && ctest --output-on-failure -j "$JOBS")
  exit 0
fi

"$ROOT/scripts/lint.sh"
start=$SECONDS
configure_suite
cmake --build "$BUILD_DIR" -j "$JOBS"
echo "test.sh: build took $((SECONDS - start)) s"
cmake --build "$BUILD_DIR" --target docs
echo "test.sh: API docs built without warnings"

"$BUILD_DIR/attention-demo" >"$BUILD_DIR/demo.log"
tail -n 1 "$BUILD_DIR/demo.log"

(cd "$BUILD_DIR" && ctest --output-on-failure -j "$JOBS")
"$ROOT/scripts/check_package.sh"
"$ROOT/scripts/check_pip.sh"
