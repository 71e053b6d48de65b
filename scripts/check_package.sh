#!/usr/bin/env bash
# Installs the library from BUILD_DIR into a temporary prefix, builds examples/load_python_weights
# against the installed package as a downstream project would, and runs it on weights that
# Python saves.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cmake --install "$BUILD_DIR" --prefix "$work/prefix" >/dev/null
cmake -S "$ROOT/examples/load_python_weights" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" -j "$JOBS" >/dev/null
"$PYTHON" "$ROOT/examples/load_python_weights/save_weights.py" "$work"
for file in mha.pt mha_state_dict.pt; do
  "$work/build/load-python-weights" "$work/$file"
done
echo "check_package.sh: the installed package builds and runs the example"
