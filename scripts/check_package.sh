#!/usr/bin/env bash
# Installs the library from BUILD_DIR into a temporary prefix, builds the examples against the
# installed package as a downstream project would, and runs them: examples/load_python_weights on
# weights that Python saves, examples/gpt on the book's GPT that examples/gpt/train.py trained
# (models/gpt/), which must generate Python's tokens.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

build_example "$work" load_python_weights
"$PYTHON" "$ROOT/examples/load_python_weights/save_weights.py" "$work"
for file in mha.pt mha_state_dict.pt; do
  "$work/load_python_weights/load-python-weights" "$work/$file"
done
build_example "$work" gpt
"$work/gpt/gpt" "$ROOT/models/gpt"
echo "check_package.sh: the installed package builds and runs the examples"
