#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test. Exits non-zero on any failure.
set -euo pipefail
source "$(dirname "$0")/common.sh"

"$ROOT/scripts/setup.sh"
start=$SECONDS
configure_and_build -DATTENTION_BUILD_TESTS=ON -DATTENTION_BUILD_TOOLS=ON
echo "test.sh: build took $((SECONDS - start)) s"

"$BUILD_DIR/attention-demo" >"$BUILD_DIR/demo.log"
tail -n 1 "$BUILD_DIR/demo.log"

cd "$BUILD_DIR"
ctest --output-on-failure -j "$JOBS"
