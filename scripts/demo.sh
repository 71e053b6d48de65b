#!/usr/bin/env bash
# Installs what is missing, builds, and walks through the article with attention-demo.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

"$ROOT/scripts/setup.sh"
configure_and_build -DATTENTION_BUILD_TESTS=OFF -DATTENTION_BUILD_TOOLS=ON
"$BUILD_DIR/attention-demo" "$@"
