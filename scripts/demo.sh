#!/usr/bin/env bash
# Installs what is missing, builds attention-demo in scripts/test.sh's build (the same folder and
# configuration, so that running both compiles the library once), and walks through the article.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

"$ROOT/scripts/setup.sh"
configure_suite >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS" --target attention-demo
"$BUILD_DIR/attention-demo" "$@"
